"""``vit_rollout`` case: timm ViT-B/16 at 224 (random weights), [CLS] attention and rollout against the fused forward.

Timing is the vision developer's ``bench/vit_rollout.measure`` (capture + [CLS] attention + attention rollout,
Abnar & Zuidema 2020, against the plain fused forward; ``page_s`` adds copying every map to the CPU as the page does;
target ratio ≤ 1.3), run in a fresh process. Added here: ``extra_mb``, the peak memory of the page's path (every
layer's ``(12, 197, 197)`` float32 maps + [CLS] + rollout) above the fused forward, each side in a fresh process.
"""
from __future__ import annotations

from bench.measure import measure_memory
from bench.worker import worker


def vit_paths(device: str, modes=("ours", "baseline")) -> dict:
    import timm
    import torch

    from models.analysis import rollout
    from models.core import capture_timm

    paths = {}
    torch.manual_seed(0)
    pixels = torch.randn(1, 3, 224, 224, device=device)
    if "ours" in modes:
        torch.manual_seed(0)
        model = timm.create_model("vit_base_patch16_224", pretrained=False).to(device).eval()
        capture_timm.disable_fused_attention(model)

        def ours():
            logits, layers = capture_timm.vit_attention(model, pixels)  # (heads, 197, 197) per layer, float32
            grid = model.patch_embed.grid_size
            cls_attention = layers[-1][:, 0, 1:].reshape(-1, *grid)  # last layer, per head
            return logits.softmax(-1).topk(5), cls_attention, rollout.cls_rollout(layers, 1, grid)

        paths["ours"] = ours
    if "baseline" in modes:
        torch.manual_seed(0)
        plain = timm.create_model("vit_base_patch16_224", pretrained=False).to(device).eval()

        def baseline():
            with torch.inference_mode():
                return plain(pixels).softmax(-1).topk(5)

        paths["baseline"] = baseline
    return paths


def task_vit_time(job: dict) -> dict:
    """The vision developer's timing (bench/vit_rollout.py): [CLS] rows + rollout on the device, and the page path."""
    from bench import vit_rollout

    return vit_rollout.measure(job["device"], repeats=job["repeats"], threads=job["threads"])


def task_vit_memory(job: dict) -> dict:
    fn = vit_paths(job["device"], modes=(job["mode"],))[job["mode"]]
    fn()
    memory, result = measure_memory(fn, job["device"])
    return memory


def case_vit_rollout(device: str, repeats: int, threads: int) -> dict:
    common = {"device": device, "threads": threads}
    timing = worker({"task": "vit_time", "repeats": repeats, **common})
    base = worker({"task": "vit_memory", "mode": "baseline", **common})
    ours = worker({"task": "vit_memory", "mode": "ours", **common})
    return {**timing, "extra_mb": ours["peak_mb"] - base["peak_mb"], "bytes": 12 * 12 * 197 * 197 * 4,
            "memory": "extra_mb: every layer's (12, 197, 197) float32 maps on the CPU + [CLS] + rollout (the page's "
                      "path) above the fused forward"}
