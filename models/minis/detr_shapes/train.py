"""Train the offline mini DETR on generated shapes with boxes: ``python -m models.minis.detr_shapes.train``.

A real transformers ``DetrForObjectDetection`` (Carion et al. 2020, "End-to-End Object Detection with Transformers")
scaled down so it trains on one CPU thread in about an hour: a small ResNet backbone (transformers' ``ResNetConfig``,
2 stages, stride 8: a 64 × 64 px image becomes 8 × 8 = 64 image tokens), a 2-layer encoder and a 3-layer decoder at
width 64 with 4 heads, and 8 object queries. Trained with DETR's own loss (Hungarian matching; class, L1 and GIoU
box terms; auxiliary losses after every decoder layer), on batches drawn from a pool of generated scenes that is
renewed a little every step (``data.ScenePool``, with the square's 8 exact symmetries). A checkpoint with a quick
AP on 200 test scenes is saved every ``checkpoint_every`` steps, so a run that is cut off still leaves weights.
Box AP is measured on 600 images from a separate random stream. Saved with ``save_pretrained`` (config.json +
model.safetensors), so the app loads it through transformers with the capture attention function like any DETR.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from models.minis import cli
from models.minis.detr_shapes import data, metrics
from models.minis.vit_shapes.train import (
    to_tensor,  # the same uint8 -> normalised tensor the shapes minis use
)

OUT_DIR = Path(__file__).resolve().parents[3] / "sample_data" / "detr_shapes"
PAGE_THRESHOLD = 0.5  # the DETR page's default score threshold: duplicates are counted at it


@dataclass
class Config:
    img_size: int = data.IMAGE_SIZE
    embedding_size: int = 32  # the backbone's stem
    hidden_sizes: tuple[int, ...] = (32, 64)  # two ResNet stages: stride 4 then 8 → 8 × 8 image tokens
    d_model: int = 64
    heads: int = 4
    encoder_layers: int = 2
    decoder_layers: int = 3
    ffn_dim: int = 128
    num_queries: int = 8  # at most 3 objects per image: most queries learn "no object"
    bbox_loss: int = 5  # DETR's L1 weight
    giou_loss: int = 3  # DETR uses 2; a little more pulls the boxes off the mean box sooner
    class_cost: int = 1  # the class term of the Hungarian matching cost (DETR's 1)
    eos_coefficient: float = 0.1  # weight of "no object" in the class loss (DETR's 0.1)
    batch_size: int = 16
    pool_size: int = 2000  # training scenes kept; ``pool_fresh`` of them replaced every step (data.ScenePool)
    pool_fresh: int = 4
    lr: float = 3e-4
    weight_decay: float = 1e-4
    clip: float = 0.1  # DETR's gradient-norm clip
    warmup_steps: int = 300
    max_steps: int = 60000
    max_minutes: float = 62.0  # wall-clock minutes (the machine is shared; one thread, nice)
    checkpoint_every: int = 2000  # steps: save the weights and a quick AP so a cut-off run is still usable
    clutter_start: float = 0.0  # share of photo backgrounds at the start …
    clutter_end: float = 0.5  # … and from half-way on (the test mix)
    test_images: int = 600
    test_clutter: float = 0.5
    seed: int = 0
    test_seed: int = 424242
    mean: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))
    std: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))


def build_model(config: Config):
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    backbone = ResNetConfig(num_channels=3, embedding_size=config.embedding_size,
                            hidden_sizes=list(config.hidden_sizes), depths=[1] * len(config.hidden_sizes),
                            layer_type="basic", out_features=[f"stage{len(config.hidden_sizes)}"])
    detr = DetrConfig(backbone_config=backbone, d_model=config.d_model, encoder_layers=config.encoder_layers,
                      decoder_layers=config.decoder_layers, encoder_attention_heads=config.heads,
                      decoder_attention_heads=config.heads, encoder_ffn_dim=config.ffn_dim,
                      decoder_ffn_dim=config.ffn_dim, num_queries=config.num_queries, dropout=0.0,
                      bbox_loss_coefficient=config.bbox_loss, giou_loss_coefficient=config.giou_loss,
                      bbox_cost=config.bbox_loss, giou_cost=config.giou_loss, class_cost=config.class_cost,
                      eos_coefficient=config.eos_coefficient,
                      auxiliary_loss=True, num_labels=len(data.CLASSES),
                      id2label=dict(enumerate(data.LABELS)), label2id={n: i for i, n in enumerate(data.LABELS)})
    model = DetrForObjectDetection(detr)
    model.requires_grad_(True)  # DETR freezes a ResNet's stem for pretrained weights; ours start from scratch
    return model


def batch(rng: np.random.Generator, size: int, clutter: float) -> tuple[np.ndarray, list[data.Scene]]:
    scenes = [data.make_scene(rng, clutter) for _ in range(size)]
    return np.stack([s.image for s in scenes]), scenes


def detections(model, pixels: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every query's box (x0, y0, x1, y1 pixels), score (best class probability) and class, per image."""
    out = model(pixel_values=pixels)
    probabilities = out.logits.softmax(-1)[..., :-1]  # the last class is "no object"
    scores, labels = probabilities.max(-1)
    cx, cy, w, h = out.pred_boxes.unbind(-1)
    boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1) * pixels.shape[-1]
    return [(b.numpy(), s.numpy(), l.numpy()) for b, s, l in zip(boxes, scores, labels)]


@torch.no_grad()
def evaluate(model, config: Config, clutter: float | None = None, images: int | None = None) -> dict:
    """Box mAP at IoU 0.5 and 0.75 (and per class at 0.5) on ``test_images`` scenes of the test stream."""
    model.eval()
    rng = np.random.default_rng(config.test_seed)
    clutter = config.test_clutter if clutter is None else clutter
    images = config.test_images if images is None else images
    found, truths = [], []
    for start in range(0, images, 100):
        pixels, scenes = batch(rng, min(100, images - start), clutter)
        found += detections(model, to_tensor(pixels, config))
        truths += [(s.boxes, s.labels) for s in scenes]
    ap50, per_class = metrics.average_precision(found, truths, len(data.CLASSES), 0.5)
    ap75, _ = metrics.average_precision(found, truths, len(data.CLASSES), 0.75)
    repeats = metrics.duplicates(found, truths, PAGE_THRESHOLD)
    return {"ap50": ap50, "ap75": ap75, "ap50_per_class": dict(zip(data.LABELS, per_class)),
            "detections_per_found_object": repeats["per_found_object"],
            "duplicated_objects": repeats["duplicated_share"], "found_objects": repeats["found_share"],
            "queries_above_half_per_object": repeats["per_object"],
            "test_images": len(truths), "test_objects": int(sum(len(t[1]) for t in truths))}


def train(config: Config, out_dir: Path = OUT_DIR, log_every: int = 100, init: Path | None = None) -> dict:
    """Train from scratch, or go on from the weights saved in ``init`` (a fresh optimiser and schedule; the card
    adds the earlier run's steps and minutes, recorded in its metrics.json)."""
    torch.set_num_threads(1)  # the machine is shared
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed + (1 if init else 0))  # new scenes for the second run
    model = build_model(config)
    earlier = None
    if init is not None:
        from transformers import DetrForObjectDetection

        model.load_state_dict(DetrForObjectDetection.from_pretrained(init).state_dict())
        model.requires_grad_(True)
        earlier = json.loads((init / "metrics.json").read_text())
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, foreach=True)
    pool = data.ScenePool(rng, config.pool_size, config.clutter_start)
    started, cpu_started = time.time(), time.process_time()
    step, running = 0, 0.0

    def progress() -> float:
        return max(step / config.max_steps, (time.time() - started) / (config.max_minutes * 60))

    while progress() < 1.0:
        model.train()
        done = progress()
        clutter = config.clutter_start + (config.clutter_end - config.clutter_start) * min(1.0, 2 * done)
        lr = config.lr * min(1.0, (step + 1) / config.warmup_steps) * 0.5 * (1 + math.cos(math.pi * done))
        for group in optimizer.param_groups:
            group["lr"] = lr
        scenes = pool.draw(rng, config.batch_size, clutter, config.pool_fresh)
        pixels = np.stack([s.image for s in scenes])
        labels = [{"class_labels": torch.from_numpy(s.labels), "boxes": torch.from_numpy(data.to_cxcywh(s.boxes))}
                  for s in scenes]
        loss = model(pixel_values=to_tensor(pixels, config), labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        optimizer.step()
        running = 0.98 * running + 0.02 * loss.item() if step else loss.item()
        step += 1
        if step % log_every == 0:
            print(f"step {step:5d}  loss {running:.3f}  lr {lr:.2e}  clutter {clutter:.2f}  "
                  f"{time.process_time() - cpu_started:6.0f} CPU s  {time.time() - started:6.0f} s", flush=True)
        if step % config.checkpoint_every == 0:
            quick = evaluate(model, config, images=200)
            print(f"step {step:5d}  checkpoint: AP@0.5 {quick['ap50']:.1%}  AP@0.75 {quick['ap75']:.1%}  "
                  f"{quick['detections_per_found_object']:.2f} detections per found object, "
                  f"{quick['duplicated_objects']:.0%} of objects duplicated (200 test images)", flush=True)
            save_weights(model, config, out_dir / "checkpoint")
            (out_dir / "checkpoint" / "metrics.json").write_text(json.dumps(
                {"config": asdict(config), "steps": step, "images_seen": step * config.batch_size,
                 "train_seconds": round(time.process_time() - cpu_started, 1),
                 "wall_seconds": round(time.time() - started, 1), "ap50": quick["ap50"], "ap_test_images": 200},
                indent=2))
    result = {"steps": step, "train_seconds": round(time.process_time() - cpu_started, 1),
              "wall_seconds": round(time.time() - started, 1), "images_seen": step * config.batch_size,
              "parameters": sum(p.numel() for p in model.parameters())}
    if earlier is not None:  # the whole training, both runs; the earlier run's own numbers kept beside
        result["runs"] = [*earlier.get("runs", [{k: earlier[k] for k in ("steps", "train_seconds", "wall_seconds",
                                                                           "ap50", "ap_test_images") if k in earlier}]),
                          {k: result[k] for k in ("steps", "train_seconds", "wall_seconds")}]
        for key in ("steps", "images_seen"):
            result[key] += earlier[key]
        for key in ("train_seconds", "wall_seconds"):
            result[key] = round(result[key] + earlier[key], 1)
    result.update(evaluate(model, config))
    result["ap50_photo_backgrounds"] = evaluate(model, config, clutter=1.0)["ap50"]
    result["ap50_plain_backgrounds"] = evaluate(model, config, clutter=0.0)["ap50"]
    print(json.dumps(result, indent=2))
    save_weights(model, config, out_dir)
    (out_dir / "metrics.json").write_text(json.dumps({"config": asdict(config), **result}, indent=2))
    write_card(out_dir, config, result)
    return result


def save_weights(model, config: Config, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.config.image_size = config.img_size  # read by the app: the input the model was trained at
    model.config.image_mean, model.config.image_std = list(config.mean), list(config.std)
    model.eval().save_pretrained(out_dir, safe_serialization=True)


def runs_line(result: dict) -> str:
    """How the training was split, when it was: each run's steps and minutes, and the AP after the first."""
    runs = result.get("runs")
    if not runs:
        return ""
    parts = [f"run {i + 1}: {r['steps']} steps, {r['wall_seconds'] / 60:.0f} min wall clock" +
             (f", AP@0.5 {r['ap50']:.1%} after it" if "ap50" in r else "") +
             (f" (on {r['ap_test_images']} test images)" if "ap_test_images" in r else "") +
             (f"; {r['note']}" if "note" in r else "") for i, r in enumerate(runs)]
    return (f"\n  Trained in {len(runs)} runs, each bounded in wall-clock minutes on the shared machine, later ones "
            f"starting from the earlier weights (`--init FOLDER`, FOLDER a run's output or its `checkpoint/`; fresh "
            f"optimiser and schedule): {'; '.join(parts)}.")


def duplicates_line(result: dict) -> str:
    """How often an object is found more than once at the page's threshold (DETR's set loss should make it rare), and
    the same numbers before an earlier state of the weights when the metrics record one (``before``)."""
    if "detections_per_found_object" not in result:
        return ""
    line = (f"\n- **Duplicates** (no non-maximum suppression), on the same test images at the page's score threshold "
            f"{PAGE_THRESHOLD:.0%}: {result['detections_per_found_object']:.2f} detections per found object (1.00: "
            f"one query per object), {result['duplicated_objects']:.1%} of the objects found by two queries or more; "
            f"{result['found_objects']:.1%} of the objects found at all (a box with IoU ≥ 0.5 scoring ≥ "
            f"{PAGE_THRESHOLD:.0%}). `models/minis/detr_shapes/metrics.py: duplicates`.")
    before = result.get("before")
    if before:
        line += (f" {before['when']}: {before['detections_per_found_object']:.2f} detections per found object, "
                 f"{before['duplicated_objects']:.0%} of the objects found more than once, "
                 f"{before['found_objects']:.0%} found at all, AP@0.5 {before['ap50']:.1%}. Weighting 'no object' "
                 "as much as an object silenced the duplicates within the time given, and left the model less sure "
                 "of some objects: below the threshold they are still found (the AP counts them), and the page's "
                 "threshold slider shows them, with more duplicates.")
    return line


def write_card(out_dir: Path, config: Config, result: dict) -> None:
    per_class = ", ".join(f"{name} {ap:.0%}" for name, ap in result["ap50_per_class"].items())
    grid = config.img_size // 2 ** (len(config.hidden_sizes) + 1)
    (out_dir / "card.md").write_text(f"""# detr_shapes — the offline mini DETR

A transformers `DetrForObjectDetection` (Carion et al. 2020) trained by this project so the DETR page can show each
object query's cross-attention, box and class with no download. **It detects the mini ViT's six coloured shapes
({", ".join(data.LABELS)}), nothing else**: on a photo it finds shapes or nothing.

- Architecture: a ResNet backbone (transformers `ResNetConfig`: stem {config.embedding_size} channels, stages
  {list(config.hidden_sizes)}, one basic block each, stride 8 → {grid} × {grid} image tokens), DETR encoder
  {config.encoder_layers} layers and decoder {config.decoder_layers} layers, d_model {config.d_model}, {config.heads}
  heads, FFN {config.ffn_dim}, {config.num_queries} object queries, sine position embeddings; {result['parameters']:,}
  parameters, trained from scratch.
- Input: {config.img_size} × {config.img_size} px, normalised with mean {config.mean} / std {config.std}.
- Data (`models/minis/detr_shapes/data.py`): 1–{data.MAX_OBJECTS} shapes per image (radius
  {data.MIN_RADIUS:g}–{data.MAX_RADIUS:g} px, kept apart), each class in its own hue band as for the mini ViT, on a
  plain background or a crop of the CC0 sample photos; the box is the tight box of the shape's pixels. Photo
  backgrounds ramp from {config.clutter_start:.0%} to {config.clutter_end:.0%} of images over the first half of
  training. Each batch is drawn from a pool of {config.pool_size:,} generated scenes, {config.pool_fresh} of which
  are replaced by new ones every step, each drawn through a random one of the square's 8 symmetries (flips and
  transposition move the boxes exactly; a shape keeps its class); {result['images_seen']:,} training images drawn in
  all.
- Training: DETR's loss (Hungarian matching, cost class × {config.class_cost} + L1 × {config.bbox_loss} + GIoU ×
  {config.giou_loss}; class loss with "no object" weighted {config.eos_coefficient}, L1 × {config.bbox_loss} and GIoU ×
  {config.giou_loss} box terms; auxiliary losses after every decoder layer), AdamW (lr {config.lr}, weight decay
  {config.weight_decay}, warm-up {config.warmup_steps} steps, cosine decay, gradient norm clipped at {config.clip}),
  batch {config.batch_size}, {result['steps']} steps, {result['train_seconds'] / 60:.1f} CPU minutes on one thread
  ({result['wall_seconds'] / 60:.1f} min wall clock on a machine shared with other jobs).{runs_line(result)}
- **Measured box AP@0.5: {result['ap50']:.1%}** (AP@0.75: {result['ap75']:.1%}) on {result['test_images']} held-out
  generated images ({result['test_objects']} objects; {config.test_clutter:.0%} on photo backgrounds; separate random
  stream, seed {config.test_seed}); all-point interpolated AP per class, averaged. Per class at 0.5: {per_class}.
  Only photo backgrounds: {result['ap50_photo_backgrounds']:.1%}; only plain backgrounds:
  {result['ap50_plain_backgrounds']:.1%}.{duplicates_line(result)}
- Reproduce: `python -m models.minis.detr_shapes.train` (seed {config.seed}; bounded by steps or wall-clock minutes,
  so results vary with the machine's load; `--init FOLDER` goes on from saved weights, as the runs above did, with
  the flags their notes give).
  The card is rewritten from metrics.json by `python -c "from models.minis.detr_shapes import train;
  train.rewrite_card()"`.
- Licence: the weights are this project's (same licence as the code); the backgrounds come from CC0 / public-domain
  photos (see `sample_data/images/LICENSES`).
""")


def rewrite_card(out_dir: Path = OUT_DIR) -> None:
    """The card again from the saved metrics.json (after an edit of the card's wording)."""
    saved = json.loads((out_dir / "metrics.json").read_text())
    config = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.pop("config").items()})
    write_card(out_dir, config, saved)


def main(argv: list[str] | None = None) -> None:
    def extra(parser):
        parser.add_argument("--init", type=Path,
                            help="go on from the model saved in this folder (its metrics.json too)")
        parser.add_argument("--eos-coefficient", type=float, default=Config.eos_coefficient,
                            help="weight of 'no object' in the class loss")
        parser.add_argument("--class-cost", type=int, default=Config.class_cost,
                            help="weight of the class term in the matching cost")
        parser.add_argument("--lr", type=float, default=Config.lr)
        parser.add_argument("--warmup-steps", type=int, default=Config.warmup_steps)

    args = cli.parse(__doc__, argv, OUT_DIR, Config.max_steps, Config.max_minutes, measure=False, extra=extra)
    train(Config(max_steps=args.steps, max_minutes=args.minutes, eos_coefficient=args.eos_coefficient,
                 class_cost=args.class_cost, lr=args.lr, warmup_steps=args.warmup_steps), args.out, init=args.init)


if __name__ == "__main__":
    main()
