"""Every model family, and the one way to load and run any of them (DESIGN.md, "Families and views").

    loaded = families.load(spec, device, dtype, progress)     # any registered, typed or local model
    result = families.run(loaded, inputs, options)            # the family's typed, frozen result

Adding a family = one module ``models/<name>.py`` that ends with ``FAMILY = Family(...)`` (models/family.py), plus
its name and specs in models/registry.py; this file finds the module by that name. docs/ARCHITECTURE.md has the
recipe.
"""
from __future__ import annotations

import importlib
from typing import Any

from models.family import Family
from models.loading import LoadedModel, Progress, _no_progress
from models.registry import FAMILIES as REGISTRY_FAMILIES
from models.registry import ModelSpec
from models.results import RunResult

FAMILIES: dict[str, Family] = {name: importlib.import_module(f"models.{name}").FAMILY for name in REGISTRY_FAMILIES}
assert all(family.name == name for name, family in FAMILIES.items()), "models/<name>.py declares Family(<name>, ...)"


def get(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = _no_progress) -> LoadedModel:
    """Load any registered or typed model on ``device`` in ``dtype``; every failure a user can cause is a
    ``ValueError`` that says what to do."""
    return get(spec.family).load(spec, device, dtype, progress)


def run(loaded: LoadedModel, inputs: Any, options: Any = None) -> RunResult:
    """Run ``loaded`` on ``inputs`` (``TextInput`` / ``ImageInput``) with its family's ``options``."""
    family = get(loaded.spec.family)
    if not isinstance(inputs, family.input):
        raise ValueError(f"a {family.title} reads a {family.input.__name__}, not a {type(inputs).__name__}")
    return family.run(loaded, inputs, options)
