"""ViT speed: [CLS] attention and attention rollout for one 224 × 224 image against the model's plain forward.

``measure(device, repeats, model_name)`` returns a dict (``bench/run.py`` style) with three timings, each the minimum
over ``repeats`` alternating runs after a warm-up (the machine is shared; the minimum is the least disturbed run):

- ``baseline_s``: timm's own fused forward (``F.scaled_dot_product_attention``) + softmax + top-5;
- ``ours_s``: our path: eager attention captured at ``attn_drop`` (models/core/capture_timm.py), kept on the device,
  every layer's [CLS] row per head, attention rollout (Abnar & Zuidema 2020, head mean) computed on the device,
  then the [CLS] maps, the rollout and the top-5 brought to the CPU; target ``ratio = ours_s / baseline_s <= 1.3``;
- ``page_s``: what the page's ``models.families.vit.model.run`` does on top: on the CPU every layer's full
  ``(heads, 197, 197)`` maps as float32 numpy (22 MB for ViT-B/16) for the other views; on a GPU nothing (the maps
  stay on the device, a view copies the one layer it draws; issue 30: the copy of every layer was the 1.39×).

Random weights (``pretrained=False``): speed does not depend on the values. Run: ``python -m bench.vit_rollout``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(device: str = "cpu", repeats: int = 10, model_name: str = "vit_base_patch16_224",
            threads: int | None = 1) -> dict:
    import timm
    import torch

    from models.analysis import rollout
    from models.core import capture_timm

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    plain = timm.create_model(model_name, pretrained=False).to(device).eval()
    ours_model = timm.create_model(model_name, pretrained=False).to(device).eval()
    ours_model.load_state_dict(plain.state_dict())
    capture_timm.disable_fused_attention(ours_model)
    points = capture_timm.attention_points(ours_model)
    pixels = torch.randn(1, 3, 224, 224, device=device)
    prefix = ours_model.num_prefix_tokens
    grid = tuple(ours_model.patch_embed.grid_size)

    def baseline():
        with torch.inference_mode():
            top = plain(pixels).softmax(-1).topk(5)
        return top.values.cpu(), top.indices.cpu()

    def captured():
        with torch.inference_mode(), capture_timm.recording(ours_model, points, keep=lambda o: o[0]) as rec:
            logits = ours_model(pixels)
        layers = rec.per_point()  # on the device, (heads, N, N) each
        with torch.inference_mode():
            cls_rows = torch.stack([a[:, 0, prefix:] for a in layers]).reshape(len(layers), -1, *grid)
            rolled = rollout.cls_rollout(layers, prefix, grid)  # torch in, torch out: stays on the device
            top = logits.softmax(-1).topk(5)
        return layers, (cls_rows.cpu(), rolled.cpu(), top.values.cpu(), top.indices.cpu())

    def ours():
        return captured()[1]

    def page():
        layers, small = captured()
        return [a.float().numpy() if a.device.type == "cpu" else a for a in layers], small

    paths = {"baseline": baseline, "ours": ours, "page": page}
    for fn in paths.values():  # warm-up (allocator, kernels)
        fn()
        fn()
    samples = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            _sync(device)
            started = time.perf_counter()
            fn()
            _sync(device)
            samples[name].append(time.perf_counter() - started)
    best = {name: min(values) for name, values in samples.items()}
    with torch.inference_mode():  # the captured model computes the same logits as the fused one
        agree = float((plain(pixels) - ours_model(pixels)).abs().max())
    ratio = best["ours"] / best["baseline"]
    return {"case": "vit_rollout", "model": model_name, "n": prefix + grid[0] * grid[1], "device": device,
            "threads": torch.get_num_threads(), "baseline_s": best["baseline"], "ours_s": best["ours"],
            "page_s": best["page"], "ratio": ratio, "page_ratio": best["page"] / best["baseline"],
            "max_logit_difference": agree, "samples": samples, "target": "ratio <= 1.3", "ok": ratio <= 1.3}


def main() -> None:
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        print(json.dumps(measure(device, repeats=20 if device == "cuda" else 8)), flush=True)


if __name__ == "__main__":
    main()
