"""Train the three captioning minis on generated scenes and measure them: ``python -m models.minis.captioning.train``.

    python -m models.minis.captioning.train --models show-attend-tell encoder-decoder   # in parallel: one each
    python -m models.minis.captioning.train --models decoder-only                       # needs the encoder–decoder

Each model trains on batches drawn from a pool of generated scenes renewed a little every step
(``scenes.scene_pool``, with the square's 8 symmetries), photo backgrounds ramping from none to the test mix over the
first half, for a number of optimiser steps or a budget of CPU minutes of its one thread, whichever ends first; the
learning rate (warm-up, cosine) follows the larger of the two fractions done, so a slow machine still anneals. The
decoder-only model's vision tower is the encoder–decoder's trained ViT, frozen, as LLaVA keeps its pretrained CLIP
encoder. Weights are saved every ``checkpoint_every`` steps, so a run that is cut off still leaves a model; measure
it with the run's log, which the card needs for its steps and times:

    python -m models.minis.captioning.train --models encoder-decoder --measure-only --checkpoint-log RUN.log

The shared flags (``--steps``, ``--minutes``, ``--out``, ``--measure-only``, ``--threads``) are
``models/minis/cli.py``'s.

Writes ``sample_data/captioning/<model>/``: the weights (transformers' ``save_pretrained`` for the two Transformers,
config.json + model.safetensors for Show, Attend and Tell), the shared word-level tokenizer, ``metrics.json`` (every
number of the card) and ``card.md``.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.minis import cli
from models.minis.captioning import architectures, card, metrics, scenes, vocabulary
from models.minis.captioning.show_attend_tell import (
    ShowAttendTell,
    ShowAttendTellConfig,
)

OUT = Path(__file__).resolve().parents[3] / "sample_data" / "captioning"


@dataclass
class Config:
    steps: int = 8000
    minutes: float = 28.0  # CPU minutes of this process's one thread (the budget is 30 per model)
    batch_size: int = 32
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 300
    clip_norm: float = 1.0
    pool_size: int = 4000  # generated scenes kept; ``pool_fresh`` of them replaced at every step
    pool_fresh: int = 8
    clutter: float = scenes.PAGE_CLUTTER  # photo backgrounds, reached half-way through training
    checkpoint_every: int = 1000
    test_scenes: int = 600
    validation_scenes: int = 300
    seed: int = 0
    test_seed: int = 271828  # separate streams: no test or validation scene is a training scene
    validation_seed: int = 314159


STEPS = {"show-attend-tell": 8000, "encoder-decoder": 8000, "decoder-only": 6000}
LOG_LINE = re.compile(r"(?P<model>[a-z-]+) step (?P<step>\d+): loss (?P<loss>[\d.]+), (?P<cpu>[\d.]+) CPU s, "
                      r"(?P<wall>[\d.]+) wall s")  # what ``train_one`` prints every 100 steps


def build(name: str, out: Path, vision_from: Path | None = None, train_vision: bool = False):
    """A fresh model; the decoder-only one's vision tower from the encoder–decoder saved in ``vision_from`` (default:
    ``out/encoder-decoder``), frozen unless ``train_vision``."""
    if name == "show-attend-tell":
        return ShowAttendTell(ShowAttendTellConfig(vocab_size=len(vocabulary.WORDS)))
    if name == "encoder-decoder":
        return architectures.build_encoder_decoder()
    encoder = load_saved("encoder-decoder", vision_from or out / "encoder-decoder")
    return architectures.build_decoder_only(vision_state=architectures.encoder_state(encoder),
                                            freeze_vision=not train_vision)


def loss_of(model, name: str, batch: list[scenes.Scene]) -> torch.Tensor:
    pixels = metrics.to_pixels(np.stack([s.image for s in batch]))
    inputs, targets = metrics.caption_tensors([s.caption for s in batch])
    if name == "show-attend-tell":
        logits, alphas, _ = model(pixels, inputs)
        real = (targets != -100).float()[..., None]  # (B, T, 1)
        attention_total = (alphas * real).sum(1)  # (B, L): Σ_t α_ti over the real steps
        regulariser = model.config.doubly_stochastic * ((1.0 - attention_total) ** 2).mean()  # eq. 14, mean over i
    else:
        logits, _ = architectures.teacher_forced(model, name, pixels, inputs)
        regulariser = 0.0
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100) + \
        regulariser


def image_processor():
    """What prepares a picture for every mini, saved beside its weights: the shortest edge resized to 64 px
    (bicubic), a centre crop of 64 × 64, mean and std 0.5 (on a generated 64 px scene: exactly the training input)."""
    from transformers import CLIPImageProcessor

    side = scenes.IMAGE_SIZE
    return CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side},
                              image_mean=list(architectures.MEAN), image_std=list(architectures.STD),
                              do_convert_rgb=True)


def processor(tokenizer):
    """The mini VLM's ``LlavaProcessor``: ``<image>`` becomes the 64 patch placeholders ([CLS] dropped), and its chat
    template is the training prompt (placeholders, then ``<bos>``), whatever is asked."""
    from transformers import LlavaProcessor

    return LlavaProcessor(image_processor(), tokenizer, patch_size=architectures.PATCH,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          image_token=vocabulary.IMAGE, chat_template="{{ '<image><bos>' }}")


def save(name: str, model, folder: Path, half: bool = False) -> int:
    """The model, its tokenizer and its processor in ``folder``; ``half``: the weights in float16 (what ships in
    sample_data: half the bytes; the app loads them back into float32, and the card measures the reloaded model)."""
    import copy

    from safetensors.torch import save_file

    if half:
        model = copy.deepcopy(model).half()
    if name == "encoder-decoder":  # only the ids: lengths are the app's to set (a max_length here fights max_new_tokens)
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig(
            decoder_start_token_id=vocabulary.BOS_ID, bos_token_id=vocabulary.BOS_ID, eos_token_id=vocabulary.EOS_ID,
            pad_token_id=vocabulary.PAD_ID, do_sample=False, num_beams=1)
    folder.mkdir(parents=True, exist_ok=True)
    vocabulary.save(folder)
    if name == "decoder-only":
        processor(vocabulary.make_tokenizer()).save_pretrained(folder)
    else:
        image_processor().save_pretrained(folder)
    if name == "show-attend-tell":
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2))
    else:
        model.save_pretrained(folder, safe_serialization=True)
    return (folder / "model.safetensors").stat().st_size


def load_saved(name: str, folder: Path, attention: str = "eager"):
    """A model as ``save`` wrote it, in eval mode (the transformers models with ``attention`` attention)."""
    if name == "show-attend-tell":
        from safetensors.torch import load_file

        model = ShowAttendTell(ShowAttendTellConfig.from_dict(json.loads((folder / "config.json").read_text())))
        model.load_state_dict(load_file(str(folder / "model.safetensors")))  # float16 on disk: copied into float32
        return model.eval()
    import transformers

    cls = transformers.VisionEncoderDecoderModel if name == "encoder-decoder" else \
        transformers.LlavaForConditionalGeneration
    return cls.from_pretrained(folder, attn_implementation=attention, dtype=torch.float32).eval()


def train_one(name: str, config: Config, out: Path, log=print, vision_from: Path | None = None,
              train_vision: bool = False) -> tuple[object, dict]:
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    model = build(name, out, vision_from, train_vision)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trained, lr=config.learning_rate, weight_decay=config.weight_decay)
    pool = scenes.scene_pool(rng, config.pool_size, 0.0)
    started_cpu, started_wall = time.process_time(), time.time()
    step, smoothed = 0, None
    while step < config.steps:
        done = max(step / config.steps, (time.process_time() - started_cpu) / 60 / config.minutes)
        if done >= 1.0:
            break
        warm = min(1.0, (step + 1) / config.warmup_steps)
        for group in optimiser.param_groups:
            group["lr"] = config.learning_rate * warm * 0.5 * (1 + math.cos(math.pi * done))
        clutter = config.clutter * min(1.0, 2 * done)
        batch = pool.draw(rng, config.batch_size, clutter, config.pool_fresh)
        loss = loss_of(model, name, batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, config.clip_norm)
        optimiser.step()
        step += 1
        value = float(loss.detach())
        smoothed = value if smoothed is None else 0.98 * smoothed + 0.02 * value
        if step % 100 == 0:
            log(f"{name} step {step}: loss {smoothed:.3f}, {time.process_time() - started_cpu:.0f} CPU s, "
                f"{time.time() - started_wall:.0f} wall s")
        if step % config.checkpoint_every == 0:
            model.eval()
            save(name, model, out / name)
            model.train()
    model.eval()
    run = {"steps": step, "images_seen": step * config.batch_size,
           "train_cpu_seconds": round(time.process_time() - started_cpu, 1),
           "train_wall_seconds": round(time.time() - started_wall, 1), "final_loss": smoothed}
    return model, run


def measure(name: str, model, config: Config) -> dict:
    """The card's numbers on held-out streams (eager attention for the transformers models' maps)."""
    if name != "show-attend-tell":
        model.set_attn_implementation("eager")
    test_rng = np.random.default_rng(config.test_seed)
    test = [scenes.make_scene(test_rng, config.clutter) for _ in range(config.test_scenes)]
    validation_rng = np.random.default_rng(config.validation_seed)
    validation = [scenes.make_scene(validation_rng, config.clutter) for _ in range(config.validation_scenes)]
    return metrics.evaluate(model, name, test, validation)


def checkpoint_run(log: Path, name: str, config: Config) -> dict:
    """The run behind the weights a stopped training left: its last ``checkpoint_every`` save, read from the lines the
    run printed (``<model> step N: loss L, C CPU s, W wall s``). Those weights are step N's, before the learning rate
    had decayed (``stopped_at`` says so on the card)."""
    saved = None
    for found in LOG_LINE.finditer(log.read_text()):
        if found["model"] == name and int(found["step"]) % config.checkpoint_every == 0:
            saved = found
    if saved is None:
        raise SystemExit(f"{log}: no checkpoint of {name} in this log (saves every {config.checkpoint_every} steps)")
    step = int(saved["step"])
    return {"steps": step, "images_seen": step * config.batch_size, "train_cpu_seconds": float(saved["cpu"]),
            "train_wall_seconds": float(saved["wall"]), "final_loss": float(saved["loss"]), "train": asdict(config),
            "stopped_at": {"step": step, "learning_rate_left": round(learning_rate_left(config, step,
                                                                                        float(saved["cpu"])), 3)}}


def learning_rate_left(config: Config, step: int, cpu_seconds: float) -> float:
    """The learning rate's share of its peak at ``step`` (past the warm-up): the cosine of the larger fraction done."""
    done = min(1.0, max(step / config.steps, cpu_seconds / 60 / config.minutes))
    return min(1.0, (step + 1) / config.warmup_steps) * 0.5 * (1 + math.cos(math.pi * done))


def main(argv: list[str] | None = None) -> None:
    def own(parser):
        parser.add_argument("--models", nargs="+", choices=architectures.ARCHITECTURES,
                            default=list(architectures.ARCHITECTURES))
        parser.add_argument("--test-scenes", type=int, default=Config.test_scenes)
        parser.add_argument("--vision-from", type=Path, default=None,
                            help="decoder-only: the encoder–decoder folder its vision tower comes from (default: "
                                 "--out's)")
        parser.add_argument("--train-vision", action="store_true",
                            help="decoder-only: train the vision tower too (default: frozen, as LLaVA)")
        parser.add_argument("--checkpoint-log", type=Path, default=None,
                            help="with --measure-only: the log of the stopped run whose checkpoint is in --out (its "
                                 "steps, times and loss go on the card; --steps and --minutes: that run's)")

    args = cli.parse(__doc__, argv, OUT, None, Config.minutes, extra=own)  # --steps: each model's own (STEPS)
    if args.checkpoint_log and not args.measure_only:
        raise SystemExit("--checkpoint-log measures a stopped run's checkpoint: give --measure-only too")
    for name in args.models:
        config = replace(Config(), steps=args.steps or STEPS[name], minutes=args.minutes,
                         test_scenes=args.test_scenes)
        folder = args.out / name
        previous = json.loads((folder / "metrics.json").read_text()) if (folder / "metrics.json").is_file() else {}
        if args.measure_only:
            model = load_saved(name, folder)
            if args.checkpoint_log:
                run = checkpoint_run(args.checkpoint_log, name, config)
            else:
                run = {k: previous[k] for k in ("steps", "images_seen", "train_cpu_seconds", "train_wall_seconds",
                                                "final_loss", "train", "vision_tower", "stopped_at") if k in previous}
        else:
            model, run = train_one(name, config, args.out, vision_from=args.vision_from,
                                   train_vision=args.train_vision)
            run["train"] = asdict(config)
            if name == "decoder-only":
                run["vision_tower"] = {"from": str(args.vision_from or "encoder-decoder"),
                                       "trained": bool(args.train_vision)}
        size = save(name, model, folder, half=True)
        model = load_saved(name, folder)  # measured as it ships: float16 weights read back into float32
        started = time.time()
        quality = measure(name, model, config)
        result = {"model": name, **run, "parameters": sum(p.numel() for p in model.parameters()),
                  "trained_parameters": sum(p.numel() for n, p in model.named_parameters()
                                            if "vision_tower" not in n or run.get("vision_tower", {}).get("trained")),
                  "weights_bytes": size, "measure_seconds": round(time.time() - started, 1), **quality}
        (folder / "metrics.json").write_text(json.dumps(result, indent=2))
        (folder / "card.md").write_text(card.card_text(result))
        print(f"{name}: exact match {quality['exact_match']:.3f}, noun pointing "
              f"{quality['pointing']['nouns']['default']:.3f}")


if __name__ == "__main__":
    main()
