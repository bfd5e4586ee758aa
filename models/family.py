"""The family interface (DESIGN.md, "Families and views").

Every model family is one module that answers three questions, and nothing else::

    load(spec, device, dtype, progress) -> LoadedModel   # a registered model, a hub id or a local folder
    run(loaded, inputs, options) -> RunResult            # one input; frozen, typed (a subclass of RunResult)
    views: tuple[str, ...]                               # the figures its results feed, by name (viz.figures.VIEWS)

A family module ``models/<name>.py`` ends with ``FAMILY = Family(...)``; ``models/families.py`` finds it by the name
in ``registry.FAMILIES`` and is the entry point (``families.load``, ``families.run``). What differs between families
is all a module says: shared code (``models/loading.py``) does the sources, the convert-once caches, devices, dtypes
and every error message. The views are names, not functions, because ``models/`` never imports ``viz/``: the app
and the CLI look each name up in ``viz.figures.VIEWS`` (docs/ARCHITECTURE.md, "Add a view").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from models.loading import LoadedModel
from models.results import RunResult


@dataclass(frozen=True)
class Family:
    name: str  # the registry's family key: "causal_lm", "encoder", "translation", "vit", "swin", "moe"
    title: str  # what it is, in a few words ("GPT-style causal language model")
    input: type  # the inputs' class: models.inputs.TextInput or ImageInput
    load: Callable[..., LoadedModel]  # (spec, device="cpu", dtype="float32", progress=...) -> LoadedModel
    run: Callable[..., RunResult]  # (loaded, inputs, options=None) -> result
    result: type  # the class run returns (TextResult, ViTResult, ...): what its views may read
    views: tuple[str, ...]  # names in viz.figures.VIEWS this family's results feed; the first is the default
    options: type | None = None  # the run options' class (GenerationSettings, TranslationSettings); None: none
    # the registry key to load when none is named, from the run options typed (names -> text), or None for the
    # registry's default (speech: translating needs the multilingual model)
    default_model: Callable[[dict], str | None] | None = None
