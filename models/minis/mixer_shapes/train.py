"""Train the offline mini MLP-Mixer on the mini ViT's shapes: ``python -m models.minis.mixer_shapes.train``.

A real timm ``MlpMixer`` (Tolstikhin et al. 2021, "MLP-Mixer: An all-MLP Architecture for Vision") scaled down the
way the mini ViT is (models/minis/vit_shapes): 64 × 64 px input, 8 px patches → the same 8 × 8 = 64 tokens, 6 blocks
at width 64, each block a token-mixing MLP (64 → 32 → 64 tokens, shared by every channel) where a ViT has attention,
then a channel MLP; global average pooling, no [CLS]. Same data (``models/minis/vit_shapes/data.py``: a fresh batch
every step, the same curriculum) and the same held-out test stream as the mini ViT, so the two pages compare like with
like. Saved as ``config.json`` (the ``MlpMixer`` arguments, labels, data config) + ``model.safetensors``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from models.minis import cli
from models.minis.vit_shapes import data
from models.minis.vit_shapes.train import data_config, evaluate, fit, measure_shortcuts

OUT_DIR = Path(__file__).resolve().parents[3] / "sample_data" / "mixer_shapes"


@dataclass
class Config:
    img_size: int = data.IMAGE_SIZE
    patch_size: int = 8  # the mini ViT's 8 × 8 grid, so the two maps are drawn on the same patches
    embed_dim: int = 64
    num_blocks: int = 6  # the mini ViT's depth
    mlp_ratio: tuple[float, float] = (0.5, 4.0)  # token MLP hidden 32 (Mixer-S's ratio), channel MLP hidden 256
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    warmup_steps: int = 100
    max_steps: int = 2400  # the mini ViT's budget
    curriculum: float = 0.6  # photo backgrounds ramp from 10 % to 100 % of images over this fraction of training
    max_minutes: float = 13.0  # CPU minutes of this process (one thread)
    test_images: int = 1200
    seed: int = 0
    test_seed: int = 987654  # the mini ViT's test stream
    mean: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))
    std: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))

    def model_args(self) -> dict:
        return dict(img_size=self.img_size, patch_size=self.patch_size, embed_dim=self.embed_dim,
                    num_blocks=self.num_blocks, mlp_ratio=list(self.mlp_ratio), num_classes=len(data.CLASSES))


def build_model(model_args: dict) -> torch.nn.Module:
    from timm.models.mlp_mixer import MlpMixer

    args = dict(model_args)
    args["mlp_ratio"] = tuple(args["mlp_ratio"])
    return MlpMixer(**args)


def train(config: Config, out_dir: Path = OUT_DIR, log_every: int = 50) -> dict:
    from safetensors.torch import save_file

    torch.set_num_threads(1)  # the machine is shared
    torch.manual_seed(config.seed)
    model = build_model(config.model_args())
    metrics = fit(model, config, log_every)  # the mini ViT's loop, so the two train alike
    metrics.update(evaluate(model, config))
    metrics.update(measure_shortcuts(model, config))
    print(json.dumps(metrics, indent=2))

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps({
        "architecture": "MlpMixer", "model_args": config.model_args(), "label_names": list(data.LABELS),
        "data_config": data_config(config)}, indent=2))
    (out_dir / "metrics.json").write_text(json.dumps({"config": asdict(config), **metrics}, indent=2))
    write_card(out_dir, config, metrics)
    return metrics


def mixer_verdict(random_hue_accuracy: float) -> str:
    chance = 1 / len(data.CLASSES)
    if random_hue_accuracy < chance + 0.1:
        return ("like the mini ViT, the model recognises the classes by colour, not by outline. That does not change "
                "what the page shows: the token-mixing maps are properties of the weights.")
    return "the model reads the outlines too, not only the colour."


def rewrite_card(out_dir: Path = OUT_DIR) -> None:
    """Rewrite card.md from the saved metrics.json (the weights untouched)."""
    saved = json.loads((out_dir / "metrics.json").read_text())
    config = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.pop("config").items()})
    write_card(out_dir, config, saved)


def write_card(out_dir: Path, config: Config, metrics: dict) -> None:
    per_class = ", ".join(f"{label} {acc:.0%}" for label, acc in zip(data.LABELS, metrics["per_class"].values()))
    grid = config.img_size // config.patch_size
    (out_dir / "card.md").write_text(f"""# mixer_shapes — the offline mini MLP-Mixer

A timm `MlpMixer` (Tolstikhin et al. 2021) trained by this project so the MLP-Mixer page can set a Mixer's fixed
token mixing beside a ViT's attention with no download. **It knows the mini ViT's six coloured shapes
({", ".join(data.LABELS)}), not ImageNet.**

- Architecture: `timm.models.mlp_mixer.MlpMixer({json.dumps(config.model_args())})`; {metrics['parameters']:,}
  parameters. {config.num_blocks} blocks, each a token-mixing MLP ({grid * grid} → {int(config.mlp_ratio[0] *
  config.embed_dim)} → {grid * grid} tokens, the same weights for every channel) and a channel MLP; global average
  pooling (no [CLS]).
- Input: {config.img_size} × {config.img_size} px, {config.patch_size} px patches ({grid} × {grid} grid, the mini
  ViT's), normalised with mean {config.mean} / std {config.std}.
- Data: the mini ViT's generator (`models/minis/vit_shapes/data.py`, see `sample_data/vit_shapes/card.md`): one
  shape per image, each class in its own hue band, on crops of the CC0 sample photos; the same curriculum (photo
  backgrounds ramp from 10 % to 100 % over the first {config.curriculum:.0%} of training). A fresh batch every step;
  {metrics['images_seen']:,} training images in all.
- Training: AdamW (lr {config.lr}, weight decay {config.weight_decay}, label smoothing {config.label_smoothing}),
  batch {config.batch_size}, {metrics['steps']} steps, {metrics['train_seconds'] / 60:.1f} CPU minutes on one thread
  ({metrics['wall_seconds'] / 60:.1f} min wall clock on a machine shared with other jobs).
- **Measured accuracy: {metrics['accuracy']:.1%}** on {metrics['test_images']} held-out generated images, all on photo
  backgrounds (the mini ViT's test stream, seed {config.test_seed}). Per class: {per_class}. On plain backgrounds:
  {metrics['accuracy_plain_backgrounds']:.1%}. Chance: {1 / len(data.CLASSES):.1%}.
- **How much is colour?** With each shape's hue drawn at random, accuracy is
  {metrics['accuracy_random_hue']:.1%}: {mixer_verdict(metrics['accuracy_random_hue'])}
- Reproduce: `python -m models.minis.mixer_shapes.train` (seed {config.seed}; results vary slightly with the
  hardware's floating-point order).
- Licence: the weights are this project's (same licence as the code); the backgrounds come from CC0 / public-domain
  photos (see `sample_data/images/LICENSES`).
""")


def main(argv: list[str] | None = None) -> None:
    args = cli.parse(__doc__, argv, OUT_DIR, Config.max_steps, Config.max_minutes, measure=False)
    train(Config(max_steps=args.steps, max_minutes=args.minutes), args.out)


if __name__ == "__main__":
    main()
