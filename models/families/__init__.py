"""Every model family, its models, and the one way to load and run any of them (DESIGN.md, "Families and views").

    spec = families.default_spec("causal_lm")                  # or families.spec(name, key), families.custom(...)
    loaded = families.load(spec, device, dtype, progress)      # any declared, typed or local model
    result = families.run(loaded, inputs, options)             # the family's typed, frozen result

A family is one folder ``models/families/<name>/`` whose ``__init__.py`` declares ``FAMILY = Family(...)``
(models/core/family.py): its load and run, the views its results feed, its models (``specs``) and its explanation
adapter. Adding a family = that folder and its name in ``NAMES`` (docs/ARCHITECTURE.md, "Add a family").
"""
from __future__ import annotations

import importlib
from typing import Any

from models.core import construction
from models.core import specs as _specs
from models.core.family import Family
from models.core.loading import LoadedModel, Progress, _no_progress
from models.core.results import RunResult
from models.core.specs import ModelSpec

# the order the CLI and the docs list them in
NAMES = ("causal_lm", "encoder", "translation", "vit", "swin", "moe", "speech", "mixer", "detr", "captioning")
FAMILIES: dict[str, Family] = {name: importlib.import_module(f"models.families.{name}").FAMILY for name in NAMES}
for _name, _family in FAMILIES.items():
    if _family.name != _name or any(spec.family != _name for spec in _family.specs):
        raise ImportError(f"models/families/{_name}/__init__.py must declare Family({_name!r}, ...) and only "
                          f"{_name!r} specs")


def get(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def specs(family: str) -> list[ModelSpec]:
    """A family's declared models, offline first (they always work), then hub models."""
    return sorted(get(family).specs, key=lambda s: s.source == "hub")


def spec(family: str, key: str) -> ModelSpec:
    """The declared model ``key`` of ``family``; a ``ValueError`` naming the known ones otherwise."""
    for candidate in get(family).specs:
        if candidate.key == key:
            return candidate
    known = ", ".join(s.key for s in specs(family))
    raise ValueError(f"no {family} model called {key!r}; known: {known}")


def default_spec(family: str) -> ModelSpec:
    """The family's first offline model: what a page opens on."""
    offline = [s for s in specs(family) if s.offline]
    if not offline:
        raise ValueError(f"no offline model is declared for {family}")
    return offline[0]


def custom(family: str, id_or_path: str) -> ModelSpec:
    """A spec for whatever the user typed: a hub id (``owner/name``) or a local folder (checked when loaded)."""
    get(family)
    return _specs.custom(family, id_or_path)


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = _no_progress) -> LoadedModel:
    """Load any declared or typed model on ``device`` in ``dtype``; every failure a user can cause is a
    ``ValueError`` that says what to do. One model is built at a time in the process (``construction.LOCK``)."""
    with construction.LOCK:
        return get(spec.family).load(spec, device, dtype, progress)


def adopt(model: Any, processor: Any = None):
    """A model object a notebook user already holds (a transformers or timm module, in their dtype, on their device)
    as the family that runs it: a ``models.core.borrowing.Adopted``. Families are asked in ``NAMES`` order; a model
    no family takes is refused in words, naming what is taken."""
    for family in FAMILIES.values():
        if family.adopt is not None:
            adopted = family.adopt(model, processor)
            if adopted is not None:
                return adopted
    takers = ", ".join(f"{f.title} ({f.name})" for f in FAMILIES.values() if f.adopt is not None)
    raise ValueError(f"a {type(model).__name__} in memory is not one of the models the explorer takes as they are: "
                     f"{takers}. Save it (save_pretrained) and explore the folder with family=..., or explore a "
                     "model id.")


def run(loaded: LoadedModel, inputs: Any, options: Any = None) -> RunResult:
    """Run ``loaded`` on ``inputs`` (``TextInput`` / ``ImageInput`` / ``AudioInput``) with its family's ``options``."""
    family = get(loaded.spec.family)
    if not isinstance(inputs, family.input):
        raise ValueError(f"a {family.title} reads a {family.input.__name__}, not a {type(inputs).__name__}")
    return family.run(loaded, inputs, options)
