"""The shapes minis' shared training loop (models/minis/vit_shapes/train.fit), run for a few steps: the mini ViT and
the mini Mixer train through it and save what their pages load."""
from __future__ import annotations

import dataclasses
import json

import torch

from models.minis.mixer_shapes import train as mixer_train
from models.minis.vit_shapes import train as vit_train


def test_fit_takes_the_steps_it_is_given_and_moves_every_trained_weight():
    config = dataclasses.replace(vit_train.Config(), max_steps=3, warmup_steps=1, batch_size=4)
    torch.manual_seed(0)
    model = vit_train.build_model(config)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    run = vit_train.fit(model, config, log_every=1)
    assert run["steps"] == 3 and run["images_seen"] == 12
    assert run["parameters"] == sum(p.numel() for p in before.values())
    assert all(not torch.equal(before[name], p) for name, p in model.named_parameters())
    assert not model.training


def test_the_mixer_trainer_saves_a_model_its_page_loads(tmp_path):
    config = dataclasses.replace(mixer_train.Config(), max_steps=2, warmup_steps=1, batch_size=4, test_images=8)
    metrics = mixer_train.train(config, out_dir=tmp_path, log_every=1)
    assert metrics["steps"] == 2 and 0.0 <= metrics["accuracy"] <= 1.0
    saved = json.loads((tmp_path / "config.json").read_text())
    model = mixer_train.build_model(saved["model_args"])
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(tmp_path / "model.safetensors")))
    assert (tmp_path / "card.md").read_text().startswith("# mixer_shapes")


def test_every_trainer_takes_the_same_flags(monkeypatch, tmp_path):
    """One command-line shape (models/minis/cli.py): --steps, --minutes, --out, --threads on every trainer, parsed
    into what it trains with."""
    import importlib
    import pkgutil

    import models.minis
    from models.minis import cli

    seen = []

    def parse(doc, argv, out, steps, minutes, measure=True, extra=None):
        args = cli.parser(doc, out, steps, minutes, measure, extra).parse_args(argv)
        seen.append((args.steps, args.minutes, args.out, args.threads))
        raise SystemExit(0)  # parsed: stop before training

    monkeypatch.setattr(cli, "parse", parse)
    trainers = [info.name for info in pkgutil.iter_modules(models.minis.__path__) if info.ispkg]
    for name in trainers:
        module = importlib.import_module(f"models.minis.{name}.train")
        try:
            module.main(["--steps", "7", "--minutes", "0.5", "--out", str(tmp_path / name), "--threads", "1"])
        except SystemExit:
            pass
        assert seen and seen[-1] == (7, 0.5, tmp_path / name, 1), f"{name}'s trainer does not take the shared flags"
        seen.clear()
