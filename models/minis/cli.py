"""One command-line shape for every mini's trainer (``python -m models.minis.<name>.train``):

    --steps N        optimiser steps, at most (default: the mini's own)
    --minutes M      and at most this many minutes of training (default: the mini's own)
    --out DIR        where the weights, metrics.json and card.md go (default: its folder in sample_data/)
    --measure-only   re-measure the saved model in --out and rewrite metrics.json and card.md, no training
    --threads T      PyTorch CPU threads (default 1: the cards' times are one thread's)

A trainer adds its own flags after these (the translation minis' ``--models``). Training is reproducible from its
seed; each card says the command that made its weights.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable


def parser(doc: str, out: Path, steps: int | None, minutes: float, measure: bool = True,
           extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    """The shared flags with the mini's own defaults; ``measure``: the trainer can re-measure saved weights."""
    made = argparse.ArgumentParser(description=doc.strip().split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    made.add_argument("--steps", type=int, default=steps,
                      help="optimiser steps, at most (default " + ("each model's own" if steps is None else f"{steps}") + ")")
    made.add_argument("--minutes", type=float, default=minutes, help=f"training minutes, at most (default {minutes:g})")
    made.add_argument("--out", type=Path, default=out, help="folder for the weights, metrics.json and card.md")
    if measure:
        made.add_argument("--measure-only", action="store_true",
                          help="re-measure the saved model in --out and rewrite metrics.json and card.md")
    made.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads (default 1)")
    if extra is not None:
        extra(made)
    return made


def parse(doc: str, argv: list[str] | None, out: Path, steps: int | None, minutes: float, measure: bool = True,
          extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """Parse ``argv`` with the shared flags and set PyTorch's thread count."""
    import torch

    args = parser(doc, out, steps, minutes, measure, extra).parse_args(argv)
    if not measure:
        args.measure_only = False
    torch.set_num_threads(max(1, args.threads))
    return args
