"""Train the offline mini ViT on generated shapes: ``python -m models.minis.vit_shapes.train``.

A real timm ``VisionTransformer`` (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words") scaled down so it
trains on one CPU thread in minutes: 64 × 64 px input, 8 px patches → 8 × 8 = 64 patch tokens + [CLS], 6 blocks of
4 heads at width 64, classified from the [CLS] token (``global_pool="token"``, as ViT-B/16), so CLS attention and
rollout mean what they mean for the hub models. Data: ``data.py`` draws a fresh batch every step (no epoch, nothing to
over-fit); accuracy is measured on 1200 images from a separate random stream.

Saved with timm's own ``save_for_hf`` (``config.json`` with label names and data config + ``model.safetensors``), so
the app loads it through exactly the local-checkpoint path a user's own timm ViT takes.
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
from models.minis.vit_shapes import data

OUT_DIR = Path(__file__).resolve().parents[3] / "sample_data" / "vit_shapes"
ARCHITECTURE = "vit_tiny_patch16_224"  # the timm entry point; model_args below override its sizes


@dataclass
class Config:
    img_size: int = data.IMAGE_SIZE
    patch_size: int = 8  # 8 × 8 patch grid: small enough to read, big enough for distances to vary with depth
    embed_dim: int = 48  # small: a from-scratch ViT needs many updates more than width (probed: it sits at chance
    #                      for the first few hundred steps whatever the width)
    depth: int = 6  # enough layers for rollout and attention distance against depth to show a trend
    num_heads: int = 4  # head dim 12
    batch_size: int = 32  # more updates per CPU second
    lr: float = 1e-3
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    warmup_steps: int = 100
    max_steps: int = 2400  # ~4 CPU minutes; colour + outline is learnt well within it
    curriculum: float = 0.6  # fraction of training over which photo backgrounds ramp from 10 % to 100 % of images
    max_minutes: float = 13.0  # CPU minutes of this process (one thread): the 15-minute budget, on a shared machine too
    test_images: int = 1200
    seed: int = 0
    test_seed: int = 987654  # a different stream from training: test images are never seen in training
    mean: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))
    std: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))

    def model_args(self) -> dict:
        return dict(img_size=self.img_size, patch_size=self.patch_size, embed_dim=self.embed_dim, depth=self.depth,
                    num_heads=self.num_heads, num_classes=len(data.CLASSES), global_pool="token")


def to_tensor(pixels: np.ndarray, config: Config) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> normalised float32 (B, 3, H, W), the same normalisation the data config declares."""
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255.0
    mean = torch.tensor(config.mean).view(1, 3, 1, 1)
    std = torch.tensor(config.std).view(1, 3, 1, 1)
    return (x - mean) / std


def data_config(config) -> dict:
    """The preprocessing a shapes mini declares with its weights (the app's loader reads it back)."""
    return {"input_size": [3, config.img_size, config.img_size], "interpolation": "bilinear",
            "mean": list(config.mean), "std": list(config.std), "crop_pct": 1.0, "crop_mode": "center"}


def build_model(config: Config):
    import timm

    return timm.create_model(ARCHITECTURE, pretrained=False, **config.model_args())


@torch.no_grad()
def evaluate(model, config: Config, clutter: float = 1.0, class_hue: bool = True) -> dict:
    """Accuracy overall and per class on ``test_images`` images from the test stream (``clutter`` 1: every image on
    a photo background, the real task; ``class_hue`` False: colours drawn at random, so only the outline tells)."""
    model.eval()
    rng = np.random.default_rng(config.test_seed)
    correct = np.zeros(len(data.CLASSES))
    total = np.zeros(len(data.CLASSES))
    for start in range(0, config.test_images, 200):
        pixels, labels = data.make_batch(rng, min(200, config.test_images - start), clutter, class_hue)
        predicted = model(to_tensor(pixels, config)).argmax(-1).numpy()
        np.add.at(total, labels, 1)
        np.add.at(correct, labels, predicted == labels)
    return {"accuracy": float(correct.sum() / total.sum()),
            "per_class": {name: float(c / t) for name, c, t in zip(data.CLASSES, correct, total)},
            "test_images": int(total.sum())}


def measure_shortcuts(model, config: Config) -> dict:
    """Accuracy on plain backgrounds, and with the hue drawn at random (does the model read outlines at all?)."""
    return {"accuracy_plain_backgrounds": evaluate(model, config, clutter=0.0)["accuracy"],
            "accuracy_random_hue": evaluate(model, config, class_hue=False)["accuracy"]}


def fit(model: torch.nn.Module, config, log_every: int = 50) -> dict:
    """Train a shapes classifier in place on fresh batches from ``data.make_batch``: AdamW, linear warm-up then cosine
    decay over whichever budget (``max_steps`` or ``max_minutes`` of this process's CPU) runs out first, photo
    backgrounds ramped in over ``curriculum``. Shared by the mini ViT and the mini Mixer, so the two train alike.
    Returns the run's size and cost."""
    rng = np.random.default_rng(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    started, cpu_started = time.time(), time.process_time()

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return config.lr * (step + 1) / config.warmup_steps
        by_steps = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
        by_time = (time.process_time() - cpu_started) / (config.max_minutes * 60)
        return config.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, max(by_steps, by_time))))

    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    step = 0
    running = 0.0
    while step < config.max_steps and time.process_time() - cpu_started < config.max_minutes * 60:
        model.train()
        progress = max(step / config.max_steps, (time.process_time() - cpu_started) / (config.max_minutes * 60))
        clutter = min(1.0, 0.1 + 0.9 * progress / config.curriculum)
        pixels, labels = data.make_batch(rng, config.batch_size, clutter)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = loss_fn(model(to_tensor(pixels, config)), torch.from_numpy(labels))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running = 0.98 * running + 0.02 * loss.item() if step else loss.item()
        step += 1
        if step % log_every == 0:
            print(f"step {step:5d}  loss {running:.3f}  lr {lr_at(step):.2e}  "
                  f"{time.process_time() - cpu_started:6.0f} CPU s  {time.time() - started:6.0f} s", flush=True)
    model.eval()
    return {"steps": step, "train_seconds": round(time.process_time() - cpu_started, 1),
            "wall_seconds": round(time.time() - started, 1), "images_seen": step * config.batch_size,
            "parameters": sum(p.numel() for p in model.parameters())}


def train(config: Config, out_dir: Path = OUT_DIR, log_every: int = 50) -> dict:
    from timm.models import save_for_hf

    torch.set_num_threads(1)  # the machine is shared: one core, as the budget says
    torch.manual_seed(config.seed)
    model = build_model(config)
    run = fit(model, config, log_every)
    metrics = evaluate(model, config)
    metrics.update(measure_shortcuts(model, config))
    metrics.update(run)
    print(json.dumps(metrics, indent=2))

    out_dir.mkdir(parents=True, exist_ok=True)
    save_for_hf(model.eval(), str(out_dir), model_config={
        "label_names": list(data.LABELS),
        # replace what the entry point's ImageNet weights would claim: these weights are ours, trained on shapes
        "pretrained_cfg": {"tag": "vit_shapes", "license": "same as this project", "description": "mini ViT "
                           "trained on generated shapes (models/minis/vit_shapes)"}},
                model_args=config.model_args(), safe_serialization=True, data_config=data_config(config))
    (out_dir / "metrics.json").write_text(json.dumps({"config": asdict(config), **metrics}, indent=2))
    write_card(out_dir, config, metrics)
    return metrics


def shortcut_verdict(random_hue_accuracy: float) -> str:
    chance = 1 / len(data.CLASSES)
    if random_hue_accuracy < chance + 0.1:
        return ("the model recognises the classes by colour, not by outline. Its attribution maps still point at "
                "the object (that is where the colour is), which is what the ViT page needs.")
    if random_hue_accuracy < 0.8:
        return "the model uses colour mostly, and outline partly."
    return "the model reads the outlines, not only the colour."


def write_card(out_dir: Path, config: Config, metrics: dict) -> None:
    per_class = ", ".join(f"{label} {acc:.0%}" for label, acc in zip(data.LABELS, metrics["per_class"].values()))
    (out_dir / "card.md").write_text(f"""# vit_shapes — the offline mini ViT

A timm `VisionTransformer` trained by this project so the ViT page has predictions and class attributions with no
download. **It knows six coloured shapes ({", ".join(data.LABELS)}), not ImageNet**: on your own photo it will still
answer with one of them.

- Architecture: `{ARCHITECTURE}` entry point with {json.dumps(config.model_args())};
  {metrics['parameters']:,} parameters; classification from the [CLS] token.
- Input: {config.img_size} × {config.img_size} px, {config.patch_size} px patches ({config.img_size // config.patch_size}
  × {config.img_size // config.patch_size} grid), normalised with mean {config.mean} / std {config.std}.
- Data (`models/minis/vit_shapes/data.py`): one filled shape ({", ".join(data.CLASSES)}), **each class in its own
  hue band** ({data.HUE_STEP:.0f}° apart, ±{data.HUE_JITTER:.0f}°; colour and outline both carry the class, so the
  model may lean on either: a from-scratch ViT on one CPU thread learns colour long before outlines), random size
  (radius 11–22 px), brightness, position and rotation, pasted on a random crop of the CC0 sample photos in
  `sample_data/images` (blurred ≤ 1.5 px, contrast scaled 0.35–1).
  A fresh batch every step; {metrics['images_seen']:,} training images in all.
- Training: AdamW (lr {config.lr}, weight decay {config.weight_decay}, label smoothing {config.label_smoothing}),
  batch {config.batch_size}, {metrics['steps']} steps, {metrics['train_seconds'] / 60:.1f} CPU minutes on one thread
  ({metrics['wall_seconds'] / 60:.1f} min wall clock on a machine shared with other jobs).
- **Measured accuracy: {metrics['accuracy']:.1%}** on {metrics['test_images']} held-out generated images, all on photo
  backgrounds (separate random stream, seed {config.test_seed}). Per class: {per_class}. On plain backgrounds:
  {metrics['accuracy_plain_backgrounds']:.1%}. Chance: {1 / len(data.CLASSES):.1%}.
- **How much is colour?** With each shape's hue drawn at random instead of from its class band, accuracy is
  {metrics['accuracy_random_hue']:.1%}: {shortcut_verdict(metrics['accuracy_random_hue'])}
- Curriculum: the share of photo backgrounds ramps from 10 % to 100 % over the first {config.curriculum:.0%} of
  training (a from-scratch ViT learns nothing for hundreds of steps when every shape sits in clutter).
- Reproduce: `python -m models.minis.vit_shapes.train` (seed {config.seed}; results vary slightly with the
  hardware's floating-point order).
- Licence: the weights are this project's (same licence as the code); the backgrounds come from CC0 / public-domain
  photos (see `sample_data/images/LICENSES`).
""")


def reevaluate(out_dir: Path = OUT_DIR) -> dict:
    """Measure the saved model again (same test streams) and rewrite its metrics and card; training facts are kept."""
    import timm

    saved = json.loads((out_dir / "metrics.json").read_text())
    config = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved["config"].items()})
    model = timm.create_model(f"local-dir:{out_dir}", pretrained=True).eval()
    metrics = {k: saved[k] for k in ("steps", "train_seconds", "wall_seconds", "images_seen", "parameters")}
    saved_config = json.loads((out_dir / "config.json").read_text())
    saved_config["label_names"] = list(data.LABELS)  # names only; the weights are untouched
    (out_dir / "config.json").write_text(json.dumps(saved_config, indent=2))
    metrics.update(evaluate(model, config))
    metrics.update(measure_shortcuts(model, config))
    (out_dir / "metrics.json").write_text(json.dumps({"config": asdict(config), **metrics}, indent=2))
    write_card(out_dir, config, metrics)
    return metrics


def main(argv: list[str] | None = None) -> None:
    args = cli.parse(__doc__, argv, OUT_DIR, Config.max_steps, Config.max_minutes)
    if args.measure_only:
        reevaluate(args.out)
        return
    train(Config(max_steps=args.steps, max_minutes=args.minutes), args.out)


if __name__ == "__main__":
    main()
