"""MLP-Mixer (Tolstikhin et al. 2021, "MLP-Mixer: An all-MLP Architecture for Vision") from timm: attention replaced
by a token-mixing MLP, and that MLP read as a tokens × tokens "attention" map.

Each Mixer block mixes the patches with one small MLP applied to every channel alike::

    y_c = W₂ · GELU(W₁ · u_c + b₁) + b₂        u_c = LayerNorm(x)[:, c] ∈ ℝᴾ  (P patches), W₁ (H, P), W₂ (P, H)

Where a ViT computes softmax(QKᵀ/√d) from the input, the Mixer's mixing is in its weights. To draw it as a map
``M (P, P)`` (row i: how output patch i draws on each input patch j) we take the MLP's **Jacobian at u = 0**::

    M = ∂y/∂u |₀ = W₂ · diag(GELU′(b₁)) · W₁

the exact linear map the MLP applies to small inputs, fixed by the weights alone: the same for every image and every
channel. It is ``W₂W₁`` with each hidden unit weighted by how open its GELU is at rest (½ when b₁ = 0), which the bare
product ``W₂W₁`` would ignore. The nonlinearity does make the real mixing input-dependent, so ``run`` also keeps the
Jacobian at this image (``W₂ · diag(GELU′(W₁u_c + b₁)) · W₁``, averaged over channels) to show how far the fixed map
is from what the MLP did on this input. Neither is a distribution: entries are signed and rows do not sum to 1, so
the map is drawn with a diverging scale; the overlay on the photo draws |M[i]| as shares of the row.

Sources: timm hub names (``mixer_b16_224``: 196 patches, token MLP hidden 384) and the project's mini Mixer
(sample_data/mixer_shapes, trained on the mini ViT's shapes, the same 8 × 8 grid).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from models.core import images, loading
from models.core.inputs import ImageInput
from models.core.loading import LoadedModel, Progress
from models.core.results import ImageInfo, ImageResult, TokenProbability
from models.core.specs import ModelSpec

TOP_K = 5


@dataclass(eq=False)
class LoadedMixer(LoadedModel):
    """A timm ``MlpMixer`` ready to run: the model, how to preprocess for it, and its class names."""

    data_config: dict = field(default_factory=dict)
    label_names: tuple[str, ...] = ()


def _check_is_mixer(model: torch.nn.Module, spec: ModelSpec) -> None:
    blocks = getattr(model, "blocks", None)
    if not (hasattr(model, "stem") and blocks is not None and len(blocks)
            and all(hasattr(b, "mlp_tokens") and hasattr(b.mlp_tokens, "fc1") for b in blocks)):
        raise ValueError(f"'{spec.id}' is a {type(model).__name__}, not an MLP-Mixer (timm's MlpMixer with "
                         "token-mixing MLPs, e.g. mixer_b16_224); ViTs have their own page.")


def _load_mini(folder) -> tuple[torch.nn.Module, dict, tuple[str, ...]]:
    """The project's mini Mixer: ``config.json`` (MlpMixer arguments, labels, data config) + ``model.safetensors``."""
    from safetensors.torch import load_file
    from timm.models.mlp_mixer import MlpMixer

    config = json.loads((folder / "config.json").read_text())
    args = dict(config["model_args"])
    args["mlp_ratio"] = tuple(args["mlp_ratio"])
    model = MlpMixer(**args)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    data_config = dict(config["data_config"])
    data_config["input_size"] = tuple(data_config["input_size"])
    for key in ("mean", "std"):
        data_config[key] = tuple(data_config[key])
    return model, data_config, tuple(config["label_names"])


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = lambda step, fraction: None) -> LoadedMixer:
    """The mini Mixer from sample_data, or a timm hub name / local folder (read by timm)."""
    progress("Loading weights" + (" (downloading if not cached)" if spec.source == "hub" else ""), 0.2)
    if spec.source == "mini":
        with loading.library_errors(spec):
            model, config, labels = _load_mini(loading.spec_folder(spec))
    else:
        spec = spec if spec.library == "timm" else replace(spec, library="timm")
        model = loading.create_timm(spec, loading.timm_name(spec), "Mixer names look like mixer_b16_224, "
                                    "mixer_l16_224; see timm.list_models('mixer_*').")
        config, labels = images.data_config(model), loading.timm_label_names(model)
    _check_is_mixer(model, spec)
    model = loading.finish(model, device, dtype, progress)
    progress("Ready", 1.0)
    return LoadedMixer(spec, model, None, device, dtype, capture="token-mixing MLP weights (no attention)",
                       data_config=config, label_names=labels)


# --- the token-mixing map ------------------------------------------------------------------------------------------

def gelu_derivative(z: np.ndarray) -> np.ndarray:
    """d/dz of the exact GELU z·Φ(z): Φ(z) + z·φ(z)."""
    z = np.asarray(z, dtype=np.float64)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    return cdf + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def mixing_weights(block: torch.nn.Module) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The token MLP's ``W₁`` (H, P), ``b₁`` (H,), ``W₂`` (P, H) as float64."""
    mlp = block.mlp_tokens
    as_array = lambda t: t.detach().double().cpu().numpy()  # noqa: E731
    return as_array(mlp.fc1.weight), as_array(mlp.fc1.bias), as_array(mlp.fc2.weight)


def fixed_mixing(block: torch.nn.Module) -> np.ndarray:
    """``M = W₂ · diag(GELU′(b₁)) · W₁``: the token MLP's Jacobian at u = 0, float32 ``(P, P)``, signed."""
    w1, b1, w2 = mixing_weights(block)
    return ((w2 * gelu_derivative(b1)[None, :]) @ w1).astype(np.float32)


def input_mixing(block: torch.nn.Module, normed: np.ndarray) -> np.ndarray:
    """The token MLP's Jacobian at this input, averaged over channels: ``mean_c W₂ · diag(GELU′(W₁u_c + b₁)) · W₁``,
    float32 ``(P, P)``. ``normed``: LayerNorm(x) of the block's input, ``(P, C)``."""
    w1, b1, w2 = mixing_weights(block)
    gates = gelu_derivative(w1 @ np.asarray(normed, dtype=np.float64) + b1[:, None]).mean(1)  # (H,): mean over c
    return ((w2 * gates[None, :]) @ w1).astype(np.float32)


# --- running -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class MixerResult(ImageResult):
    """A Mixer on one image. It has no attention (``attention`` is empty); its mixing is ``fixed_mixing`` (layers, P, P),
    the same for every image, and ``input_mixing`` (layers, P, P), the Jacobian at this image (see the module)."""

    fixed_mixing: np.ndarray
    input_mixing: np.ndarray
    token_hidden: int  # H: the token MLP's width (the rank bound of every map)
    explanation: str = ""  # why predictions are missing, when they are (a headless Mixer)
    forward_seconds: float

    def __post_init__(self):
        for array in (self.fixed_mixing, self.input_mixing):
            array.setflags(write=False)


def run(loaded: LoadedMixer, inputs: ImageInput, options: None = None) -> MixerResult:
    """Preprocess as the model's data config says, run it, and read every block's token-mixing map."""
    model = loaded.model
    prepared = images.preprocess(inputs.pil, loaded.data_config)
    pixels = prepared.tensor.to(loaded.device, loading.torch_dtype(loaded.dtype))
    normed: list[np.ndarray] = []  # LayerNorm(x) entering each block's token MLP, (P, C); no hooks on a shared model
    started = time.perf_counter()
    with loading.friendly_out_of_memory(loaded.device, f"running {loaded.spec.key}"), torch.inference_mode():
        x = model.stem(pixels)  # (1, P, C)
        for block in model.blocks:
            normed.append(block.norm1(x)[0].float().cpu().numpy())
            x = block(x)
        output = model.forward_head(model.norm(x))  # timm's forward_features ends with the same norm
    forward_seconds = time.perf_counter() - started
    fixed = np.stack([fixed_mixing(block) for block in model.blocks])
    at_input = np.stack([input_mixing(block, u) for block, u in zip(model.blocks, normed)])

    rows, cols = model.stem.grid_size
    patch = tuple(int(p) for p in model.stem.patch_size)
    predictions: tuple[TokenProbability, ...] = ()
    if loaded.label_names:
        probabilities = output[0].float().softmax(-1).cpu()
        top = probabilities.topk(min(TOP_K, probabilities.numel()))
        predictions = tuple(TokenProbability(loaded.label_names[i], int(i), float(p))
                            for p, i in zip(top.values.tolist(), top.indices.tolist()))
    return MixerResult(model=loaded.info(), tokens=[f"patch ({r}, {c})" for r in range(rows) for c in range(cols)],
                       attention={}, input_name=inputs.name, notices=inputs.notes,
                       image=ImageInfo(prepared.crop, (rows, cols), patch, 0, ()), predictions=predictions,
                       fixed_mixing=fixed, input_mixing=at_input,
                       token_hidden=int(model.blocks[0].mlp_tokens.fc1.out_features), forward_seconds=forward_seconds)
