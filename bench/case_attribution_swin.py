"""Swin explanations (issue 17): speed of the adapter and AUCs over generated shapes.

    python -m bench.case_attribution_swin speed                 # JSON lines
    python -m bench.case_attribution_swin shapes --images 100   # AUCs per method on the mini Swin

Speed (one thread by default, paired and alternating, median of ``--repeats``):
- ``swin_gradient_rollout``, ``swin_value_norms``, ``swin_all_but_ig``: Swin-T (timm ``swin_tiny_patch4_window7_224``,
  random weights: speed needs none) at 224, 56 × 56 first-stage tokens: embeddings → hooked eager forward (window
  attention kept differentiable) → one backward → the window maps carried back to every stage's grid and rolled out
  through the merges, against timm's fused inference forward. The ViT targets (≤ 3× and ≤ 1.3×) are quoted beside
  them for scale; the issue sets no Swin target.
- ``swin_faithfulness_table``: the mini Swin shapes (64 px, 16 × 16 units) on one generated image: 8 methods (IG 32
  steps), deletion and insertion (20 steps) and 5 random orders, batched; the ViT table's target (≤ 15 s) beside it.

Shapes: ``--images`` generated images from the mini Swin's generator (seed 31337; it trained on seed 0 and was
tested on seed 12345), the true class as target, a removed patch greyed: mean deletion and insertion AUC per method
with the standard error, and random (5 orders per image).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.case_attribution import paired  # noqa: E402  (after the path fix above)


def swin_tiny():
    """A randomly initialised Swin-T at 224 as the app loads one (fused attention off, eval), and a fused copy."""
    from types import SimpleNamespace

    import timm
    import torch

    from models.core import capture_timm

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    fused = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    fused.load_state_dict(model.state_dict())
    capture_timm.disable_fused_attention(model)
    return SimpleNamespace(model=model, device="cpu"), fused


def mini():
    from models import families
    return families.load(next(s for s in families.specs("swin") if s.source == "mini"))


def speed(repeats: int) -> list[dict]:
    import torch

    from models.analysis import attribution, faithfulness
    from models.analysis.methods import SHARED
    from models.families.swin import explain as swin_explain
    from models.minis.swin_shapes import data

    rows = []
    loaded, fused = swin_tiny()
    crop = (np.random.default_rng(0).random((224, 224, 3)) * 255).astype(np.uint8)
    names = [f"class {i}" for i in range(1000)]
    pixels = swin_explain.crop_tensor(loaded.model, crop)

    def forward():
        with torch.inference_mode():
            fused(pixels)

    def explaining(methods):
        def run():
            attribution.explain(swin_explain.explainable(loaded, crop, names, 0), methods)
        return run

    cases = {"swin_gradient_rollout": (("gradient_rollout",), "ViT-B/16's target <= 3x"),
             "swin_value_norms": (("value_norms",), "ViT-B/16's target <= 1.3x"),
             "swin_all_but_ig": (tuple(m for m in SHARED if m != "integrated_gradients"), "none")}
    for case, (methods, target) in cases.items():
        ours, baseline = paired(explaining(methods), forward, repeats)
        rows.append({"case": case, "model": "swin_tiny_patch4_window7_224 (random weights), 224 px",
                     "methods": list(methods), "ours_s": ours, "baseline_s": baseline,
                     "baseline": "timm fused inference forward", "ratio": ours / baseline, "target": target})
    small = mini()
    rng = np.random.default_rng(31337)
    label = 3
    image = data.make_image(rng, label)
    times = []
    for _ in range(max(1, repeats // 2)):
        started = time.perf_counter()
        table = faithfulness.faithfulness(swin_explain.explainable(small, image, None, label), "mini", "shape",
                                          steps=20, seeds=5, ig_steps=32)
        times.append(time.perf_counter() - started)
    rows.append({"case": "swin_faithfulness_table", "model": "mini Swin shapes, one generated image",
                 "ours_s": statistics.median(times), "methods": len(table.curves), "curves": 2, "steps": 20,
                 "random_seeds": 5, "target": "the mini ViT's <= 15 s"})
    return rows


def shapes(images: int, ig_steps: int) -> dict:
    import torch

    from models.analysis import faithfulness
    from models.analysis.methods import SHARED
    from models.families.swin import explain as swin_explain
    from models.minis.swin_shapes import data

    small = mini()
    rng = np.random.default_rng(31337)
    labels = rng.permutation(np.arange(images) % len(data.CLASSES))
    deletion = {m: [] for m in [*SHARED, "random"]}
    insertion = {m: [] for m in deletion}
    correct = 0
    started = time.perf_counter()
    for index, label in enumerate(labels):
        image = data.make_image(rng, int(label))
        ex = swin_explain.explainable(small, image, None, int(label))
        found = faithfulness.faithfulness(ex, "mini", f"shape {index}", steps=20, seeds=5, ig_steps=ig_steps)
        with torch.no_grad():
            correct += int(int(ex.logits(ex.embeddings)[0].argmax()) == int(label))
        for method, curves in found.curves.items():
            deletion[method].append(curves.deletion_auc)
            insertion[method].append(curves.insertion_auc)
        deletion["random"].append(found.random_auc("deletion")[0])
        insertion["random"].append(found.random_auc("insertion")[0])
        if (index + 1) % 10 == 0:
            print(f"{index + 1}/{images} images, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    def summary(values):
        values = np.asarray(values)
        return {"mean": float(values.mean()), "se": float(values.std() / np.sqrt(len(values)))}

    return {"case": "swin_shapes", "images": images, "seed": 31337, "ig_steps": ig_steps,
            "accuracy": correct / images, "seconds": time.perf_counter() - started,
            "deletion_auc": {m: summary(v) for m, v in deletion.items()},
            "insertion_auc": {m: summary(v) for m, v in insertion.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("speed", "shapes"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--ig-steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rows = speed(args.repeats) if args.what == "speed" else [shapes(args.images, args.ig_steps)]
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
