"""Train the offline mini Swin on generated shapes: ``python -m models.minis.swin_shapes.train``.

A real timm ``SwinTransformer`` (Liu et al. 2021, "Swin Transformer: Hierarchical Vision Transformer using Shifted
Windows") scaled down so it trains on one CPU thread in minutes while keeping the structure the Swin page explains:
64 × 64 px input, 4 px patches → 16 × 16 tokens, window M = 4, three stages 16² → 8² → 4² tokens (16, 4, 1
windows), the second block of the first two stages shifted by ⌊M/2⌋ = 2, the last stage one window (no shift, as in
swin_tiny's 7 × 7 stage). Data: ``data.py`` draws it fresh each step, so there is no over-fitting to measure away.

The model is saved with timm's own ``save_for_hf`` (``config.json`` + ``model.safetensors``), so the app loads it
through exactly the local-checkpoint path a user's own timm Swin takes.
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
from models.minis.swin_shapes import data

OUT_DIR = Path(__file__).resolve().parents[3] / "sample_data" / "swin_shapes"
ARCHITECTURE = "swin_tiny_patch4_window7_224"  # the timm entry point; model_args below override its sizes


@dataclass
class Config:
    img_size: int = 64  # 16 × 16 first-stage tokens: 16 windows, then 4, then 1; trains on one CPU thread
    patch_size: int = 4
    window_size: int = 4  # 16-token windows: masks and bias tables stay readable (16 × 16, 7 × 7)
    embed_dim: int = 32
    depths: tuple[int, ...] = (2, 2, 2)  # W-MSA then SW-MSA in every stage
    num_heads: tuple[int, ...] = (2, 4, 8)  # head dim 16 throughout
    batch_size: int = 64
    lr: float = 1e-3  # 2e-3 and 3e-3 stalled at chance for 400+ steps in trial runs
    weight_decay: float = 0.05
    warmup_steps: int = 100
    max_steps: int = 3000
    max_minutes: float = 14.0  # CPU minutes of the one thread; stop early (and still evaluate) within 15
    test_images: int = 1000
    seed: int = 0
    test_seed: int = 12345  # a different stream from training: the test images are never seen in training
    mean: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))
    std: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))

    def model_args(self) -> dict:
        return dict(img_size=self.img_size, patch_size=self.patch_size, window_size=self.window_size,
                    embed_dim=self.embed_dim, depths=list(self.depths), num_heads=list(self.num_heads),
                    num_classes=len(data.CLASSES))


def build_model(config: Config) -> torch.nn.Module:
    import timm

    return timm.create_model(ARCHITECTURE, pretrained=False, drop_path_rate=0.05, **config.model_args())


@torch.no_grad()
def evaluate(model: torch.nn.Module, config: Config) -> dict:
    """Accuracy on ``config.test_images`` fresh images from the test seed, overall and per class."""
    was_training = model.training
    model.eval()
    rng = np.random.default_rng(config.test_seed)
    images, labels = data.make_batch(rng, config.test_images, config.img_size)
    predictions = []
    for start in range(0, len(images), 100):
        x = data.to_tensor(images[start:start + 100], config.mean[0], config.std[0])
        predictions.append(model(x).argmax(-1).numpy())
    predicted = np.concatenate(predictions)
    per_class = {name: float((predicted[labels == i] == i).mean()) for i, name in enumerate(data.CLASSES)}
    model.train(was_training)
    return {"accuracy": float((predicted == labels).mean()), "per_class": per_class, "test_images": len(labels)}


def train(config: Config, out_dir: Path = OUT_DIR) -> dict:
    torch.set_num_threads(1)  # the machine is shared; one thread keeps it usable for everyone else
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    model = build_model(config)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "relative_position_bias_table" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1 or "relative_position_bias_table" in n]
    optimiser = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)

    def lr_at(step: int, elapsed: float) -> float:
        """Linear warm-up, then cosine decay to 5 % over whichever budget (steps or minutes) runs out first."""
        if step < config.warmup_steps:
            return config.lr * (step + 1) / config.warmup_steps
        progress = max(step / config.max_steps, elapsed / (config.max_minutes * 60))
        return config.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    # the budget is CPU time of this single-threaded process: on a shared machine wall time says more about the
    # neighbours than about the training
    start, wall_start, step, history = time.process_time(), time.time(), 0, []
    model.train()
    while step < config.max_steps and time.process_time() - start < config.max_minutes * 60:
        images, labels = data.make_batch(rng, config.batch_size, config.img_size)
        for group in optimiser.param_groups:
            group["lr"] = lr_at(step, time.process_time() - start)
        logits = model(data.to_tensor(images, config.mean[0], config.std[0]))
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        step += 1
        if step % 25 == 0:
            history.append((step, round(loss.item(), 4)))
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.process_time() - start:6.0f} s CPU", flush=True)
    train_seconds, wall_seconds = time.process_time() - start, time.time() - wall_start

    metrics = evaluate(model, config)
    metrics.update(steps=step, train_cpu_seconds=round(train_seconds, 1), wall_seconds=round(wall_seconds, 1),
                   images_seen=step * config.batch_size,
                   parameters=sum(p.numel() for p in model.parameters()), loss_history=history,
                   threads=1, config=asdict(config))
    save(model, config, metrics, out_dir)
    write_card(metrics, out_dir)
    return metrics


def save(model: torch.nn.Module, config: Config, metrics: dict, out_dir: Path) -> None:
    """timm's own export (config.json + model.safetensors), plus metrics.json."""
    from timm.models import save_for_hf

    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    data_config = {"input_size": (3, config.img_size, config.img_size), "interpolation": "bilinear",
                   "crop_pct": 1.0, "crop_mode": "center", "mean": config.mean, "std": config.std}
    model.pretrained_cfg = {**model.pretrained_cfg, **data_config, "hf_hub_id": None, "url": None,
                            "license": "mit", "tag": "shapes"}
    save_for_hf(model, str(out_dir), model_config={"label_names": list(data.CLASSES)},
                model_args=config.model_args(), safe_serialization=True, data_config=data_config)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def _mean_loss(metrics: dict, start: int, stop: int | None) -> float:
    """Mean of the logged batch losses (one every 25 steps) in ``loss_history[start:stop]``."""
    return float(np.mean([loss for _, loss in metrics["loss_history"][start:stop]]))


def write_card(metrics: dict, out_dir: Path = OUT_DIR) -> str:
    """``card.md`` from the measured ``metrics`` (numbers are never typed by hand)."""
    cfg = metrics["config"]
    tokens = cfg["img_size"] // cfg["patch_size"]
    grids = [tokens // 2 ** i for i in range(len(cfg["depths"]))]
    per_class = ", ".join(f"{name} {value:.0%}" for name, value in metrics["per_class"].items())
    card = f"""# mini Swin shapes

A real timm `SwinTransformer` (Liu et al. 2021) trained by this project, so the Swin page works with no download.

- **Task**: which of {len(data.CLASSES)} shapes ({", ".join(data.CLASSES)}) is in a {cfg["img_size"]} × \
{cfg["img_size"]} px image. Shapes have random colour, size, position and rotation on a flat random colour with pixel
noise, half the time with faint stripes or a checkerboard (`models/minis/swin_shapes/data.py`, generated fresh every
step).
- **Architecture**: {cfg["patch_size"]} px patches → {tokens} × {tokens} tokens, window M = {cfg["window_size"]}, \
{len(cfg["depths"])} stages of {" → ".join(f"{g}²" for g in grids)} tokens, depths {tuple(cfg["depths"])}, heads \
{tuple(cfg["num_heads"])}, C = {cfg["embed_dim"]}; {metrics["parameters"]:,} parameters. Every second block of a
stage is SW-MSA (shift 2) while the stage has more than one window.
- **Training**: `python -m models.minis.swin_shapes.train` — AdamW (lr {cfg["lr"]}, weight decay \
{cfg["weight_decay"]}), batch {cfg["batch_size"]}, {metrics["steps"]:,} steps ({metrics["images_seen"]:,} images), \
{metrics["train_cpu_seconds"] / 60:.1f} CPU-minutes on one thread ({metrics["wall_seconds"] / 60:.0f} min wall \
clock on a shared machine), seed {cfg["seed"]}.
- **Measured accuracy**: **{metrics["accuracy"]:.1%}** on {metrics["test_images"]:,} held-out images drawn from a \
separate random stream (seed {cfg["test_seed"]}); chance is {1 / len(data.CLASSES):.1%}. Per class: {per_class}.
- **Loss**: mean batch loss {_mean_loss(metrics, 0, 4):.2f} over the first 100 steps, {_mean_loss(metrics, -4, None):.2f} \
over the last 100 ({_mean_loss(metrics, -8, -4):.2f} the 100 before: \
{"still falling, so a longer run would score higher" if _mean_loss(metrics, -4, None) < _mean_loss(metrics, -8, -4)
 else "flat"}); the budget keeps training within 15 CPU-minutes.
- **Limits**: it has only ever seen these shapes. On a photo its prediction is one of the eight shape names and means
nothing; the windows, masks, bias tables and attention it computes are still exactly what a Swin does.
- **Licence**: this project's licence; the data is generated, no third-party images.
"""
    (out_dir / "card.md").write_text(card)
    return card


def main(argv: list[str] | None = None) -> None:
    def card_only(parser):
        parser.add_argument("--card-only", action="store_true", help="rewrite card.md from the saved metrics.json")

    args = cli.parse(__doc__, argv, OUT_DIR, Config.max_steps, Config.max_minutes, measure=False, extra=card_only)
    if args.card_only:
        print(write_card(json.loads((args.out / "metrics.json").read_text()), args.out))
        return
    metrics = train(Config(max_steps=args.steps, max_minutes=args.minutes), args.out)
    print(json.dumps({k: metrics[k] for k in ("accuracy", "per_class", "steps", "train_cpu_seconds")}, indent=2))


if __name__ == "__main__":
    main()
