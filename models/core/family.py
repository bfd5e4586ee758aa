"""The family interface (DESIGN.md, "Families and views").

Every model family is one folder, ``models/families/<name>/``, that answers three questions and declares what it has::

    load(spec, device, dtype, progress) -> LoadedModel   # a declared model, a hub id or a local folder
    run(loaded, inputs, options) -> RunResult            # one input; frozen, typed (a subclass of RunResult)
    views: tuple[str, ...]                               # the figures its results feed, by name (viz.figures.VIEWS)
    specs, explainer                                     # its models (offline first) and its explanation adapter
    adopt(model, processor) -> Adopted | None            # a model object a notebook user holds (optional)

Its ``__init__.py`` declares ``FAMILY = Family(...)``; ``models.families`` collects them and is the entry point
(``families.load``, ``families.run``, ``families.specs``). What differs between families is all a folder says:
shared code (``models/core/loading.py``) does the sources, the convert-once caches, devices, dtypes and every error
message. The views are names, not functions, because ``models/`` never imports ``viz/``: the app and the CLI look
each name up in ``viz.figures.VIEWS`` (docs/ARCHITECTURE.md, "Add a view").
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from models.core.loading import LoadedModel
from models.core.results import RunResult
from models.core.specs import ModelSpec


@dataclass(frozen=True)
class Family:
    name: str  # its folder's name: "causal_lm", "encoder", "translation", "vit", "swin", "moe", ...
    title: str  # what it is, in a few words ("GPT-style causal language model")
    input: type  # the inputs' class: models.core.inputs.TextInput or ImageInput
    load: Callable[..., LoadedModel]  # (spec, device="cpu", dtype="float32", progress=...) -> LoadedModel
    run: Callable[..., RunResult]  # (loaded, inputs, options=None) -> result
    result: type  # the class run returns (TextResult, ViTResult, ...): what its views may read
    views: tuple[str, ...]  # names in viz.figures.VIEWS this family's results feed; the first is the default
    options: type | None = None  # the run options' class (GenerationSettings, TranslationSettings); None: none
    # the spec key to load when none is named, from the run options typed (names -> text), or None for the
    # family's default (speech: translating needs the multilingual model)
    default_model: Callable[[dict], str | None] | None = None
    specs: tuple[ModelSpec, ...] = ()  # the models it offers: packaged and minis (offline) and hub ids
    # the explanation adapter (models.analysis.attribution's shared methods read a family through it): a module with
    # ``from_result(loaded, result, target, replacement) -> Explainable`` (models/families/vit/explain.py); None: none
    explainer: ModuleType | None = None
    # how it takes in a model object a notebook user already holds (app/notebook.py): ``adopt(model, processor)``
    # returns a ``models.core.borrowing.Adopted`` when the model is one this family runs, None when it is not, and
    # raises ValueError in words when it is but cannot be run (no tokenizer); None: the family takes none
    adopt: Callable[..., object] | None = None
