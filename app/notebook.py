"""The explorer in a notebook: the app's models, numbers and figures, one call away (docs/NOTEBOOK.md).

    from app.notebook import explore

    run = explore("SmolLM2-135M-Instruct", "The animal didn't cross the street because it was too tired.")
    run.head(13, 8)              # the app's own figure; as a cell's last expression it draws itself
    run.weights(13, 8)           # (queries, keys) float32 numpy; run.maps[13]: (heads, queries, keys)
    run.lens().save("lens.png")  # PNG, SVG, HTML, CSV, JSON, NPZ: what the page's downloads write

    run = explore(model, tokenizer, text)   # a transformers model you already hold, in your dtype, on your device

Two ways in. By id or folder, a model is loaded exactly as the app loads it (``models.families``: the registry's
offline models, hub ids, allowed local folders, the same refusals as ``ValueError`` in words). A model object already
in memory is taken by the family that runs its kind (``Family.adopt``: causal LMs, BERT-family encoders, timm ViTs)
and borrowed for each call that needs it (``models/core/borrowing.py``): switched to the capture attention function,
eval mode and no gradients, then handed back exactly as found, even when the call raises.

Everything drawn comes from the registry of views (``viz.figures``) through the same analyses as the page and
``python -m app.cli``; this module only turns Python arguments into a family's inputs and a view's options. It
imports no Streamlit.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import html
import io
import os
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, overload

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _check_own_packages() -> None:
    """``models`` and ``viz`` must be this project's, checked before either is imported: a package of the same name
    earlier on ``sys.path`` (a user's own ``models``, common in ML projects, or a folder of that name beside the
    notebook) would be imported instead, with errors that say nothing of why."""
    import importlib.util
    import sys

    for name in ("models", "viz"):
        module = sys.modules.get(name)
        spec = None if module is not None else importlib.util.find_spec(name)
        where = getattr(module, "__file__", None) if module is not None else (spec.origin if spec else None)
        if where is None or ROOT not in Path(where).resolve().parents:
            raise ImportError(f"'{name}' is imported from {where or 'nowhere'}, not from the attention explorer in "
                              f"{ROOT}: another package of that name comes first on sys.path (one of yours, or a "
                              "folder beside the notebook). Rename yours, or start the notebook in another folder "
                              "(docs/NOTEBOOK.md, 'Installing').")


_check_own_packages()

from models import families  # noqa: E402  (after the check: it says why when another package is in the way)
from models.core import borrowing, loading  # noqa: E402
from models.core.family import Family  # noqa: E402
from models.core.loading import LoadedModel  # noqa: E402
from models.core.results import AttentionMaps, GenerationStep, RunResult  # noqa: E402
from models.core.specs import ModelSpec  # noqa: E402
from viz import figures  # noqa: E402  (imported here: every view registers itself, once, not on the first figure)

if TYPE_CHECKING:
    import altair as alt
    import pandas as pd
    import torch
    from PIL import Image

    from viz.figure import Figure

__all__ = ["explore", "Exploration", "Maps", "Shown", "forget", "registry"]

# the family views behind the named shortcuts, first offered wins (a ViT's "head" is its [CLS] map)
SHORTCUTS = {"head": ("head", "cls"), "grid": ("grid", "cls_heads"), "lens": ("lens", "decoder_lens")}
TRANSLATION_TOKENS = 128  # = models.families.translation.model.DEFAULT_MAX_SOURCE_TOKENS, the page's and the CLI's
KEPT_MODELS = 2  # models loaded by id stay loaded for the next explore() (forget() drops them)
_loaded: OrderedDict[tuple, LoadedModel] = OrderedDict()


# --- the figures ----------------------------------------------------------------------------------------------------

class Shown:
    """One of the app's figures in a notebook: the last expression of a cell draws it (Jupyter, JupyterLab, VS Code,
    Colab: Altair's own mimebundle, with the Vega-Lite spec; a large map as a PNG), ``save`` writes its files, and its
    numbers are ``table()`` (pandas), ``arrays()`` (numpy) and ``payload()`` (what the JSON file holds)."""

    def __init__(self, figure: "Figure"):
        self.figure = figure  # the viz.figure.Figure the page and the CLI draw

    @property
    def chart(self) -> "alt.TopLevelMixin | None":
        """The Altair chart (several parts combined as the page lays them out), or None for an image."""
        return self.figure.export_chart()

    @property
    def image(self) -> "Image.Image | None":
        """The PIL image of a view drawn as one (large maps, the all-heads grid, image overlays), else None."""
        return self.figure.image

    @property
    def caption(self) -> str:
        return self.figure.caption

    @property
    def stem(self) -> str:
        """The file name the figure's files get: model, input and settings."""
        return self.figure.stem

    def table(self) -> "pd.DataFrame | None":
        """The figure's numbers as a pandas DataFrame (the CSV file), or None when it has none."""
        return None if self.figure.table is None else self.figure.table()

    def arrays(self) -> dict[str, np.ndarray]:
        """The figure's raw arrays (the NPZ file), {} when it has none."""
        return {} if self.figure.arrays is None else dict(self.figure.arrays())

    def payload(self) -> dict:
        """The figure's numbers and settings (the JSON file), {} when it has none."""
        return {} if self.figure.payload is None else dict(self.figure.payload())

    def save(self, path: str | os.PathLike) -> list[Path]:
        """Write the figure: a file named ``*.png``, ``*.svg``, ``*.html``, ``*.csv``, ``*.json`` or ``*.npz`` gets
        that format (HTML opens offline: Vega is inlined); a folder gets every format the figure has, under its
        ``stem`` (what ``python -m app.cli --format ...`` writes). Returns the paths written."""
        from viz import export

        path = Path(path)
        offers = {offer.format: offer for offer in export.offers(self.figure)}
        fmt = path.suffix.lower().lstrip(".")
        if not fmt or path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            written = export.write(self.figure, list(offers), path)
            html_path = path / f"{self.stem}.html"
            html_path.write_text(export.figure_html(self.figure), encoding="utf-8")
            return written + [html_path]
        if fmt == "html":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(export.figure_html(self.figure), encoding="utf-8")
            return [path]
        if fmt not in offers:
            raise ValueError(f"this figure cannot be saved as .{fmt}; it can be: "
                             f"{', '.join('.' + f for f in [*offers, 'html'])}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(offers[fmt].make())
        return [path]

    def _repr_mimebundle_(self, include=None, exclude=None) -> tuple[dict[str, Any], dict[str, Any]]:
        """What Jupyter shows: Altair's renderer's bundle (by default its HTML, which loads Vega as ES modules: no
        RequireJS) plus the Vega-Lite spec under its own MIME type; an image as PNG; the caption under either."""
        import altair as alt

        chart = self.chart
        if chart is not None:
            with alt.data_transformers.enable(max_rows=None):  # the page draws every row; so does the notebook
                spec = chart.to_dict(context={"pre_transform": False})
            rendered = alt.renderers.get()(spec)
            data, metadata = rendered if isinstance(rendered, tuple) else (rendered, {})
            data = {**dict(data), _vegalite_mime(): spec}
        elif self.image is not None:
            buffer = io.BytesIO()
            self.image.save(buffer, format="PNG")
            data, metadata = {"image/png": base64.b64encode(buffer.getvalue()).decode("ascii")}, {}
        else:
            data, metadata = {}, {}
        if self.caption and "text/html" in data:
            data["text/html"] += f'<p style="font-size: 12px">{html.escape(self.caption)}</p>'
        data["text/plain"] = repr(self)
        return data, dict(metadata)

    def __repr__(self) -> str:
        return f"<figure {self.stem}{': ' + self.caption if self.caption else ''}>"


def _vegalite_mime() -> str:
    """The Vega-Lite MIME type in the form notebook frontends register and nbformat accepts for JSON
    (``application/vnd.vegalite.v6+json``; Altair's own constant ends ".json", which a saved notebook refuses)."""
    from altair.vegalite import SCHEMA_VERSION

    return f"application/vnd.vegalite.{SCHEMA_VERSION.split('.')[0]}+json"


# --- the numbers ------------------------------------------------------------------------------------------------------

class Maps(Sequence):
    """One kind of attention ("self", "encoder", "decoder", "cross") of a run, layer by layer: ``maps[i]`` is layer
    ``i``'s float32 ``(heads, queries, keys)`` numpy array (read-only; rows sum to 1, masked entries 0), computed from
    the kept queries and keys when it is read, so only what you index is ever held."""

    def __init__(self, maps: AttentionMaps):
        self._maps = maps

    def __len__(self) -> int:
        return self._maps.num_layers

    def __getitem__(self, layer: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(layer, slice):
            return [self[i] for i in range(len(self))[layer]]
        return self._maps.layer(_layer_index(layer, len(self)))

    @property
    def kind(self) -> str:
        return self._maps.kind

    @property
    def query_tokens(self) -> list[str]:
        return list(self._maps.query_tokens)

    @property
    def key_tokens(self) -> list[str]:
        return list(self._maps.key_tokens)

    def allowed(self, layer: int) -> np.ndarray:
        """Boolean ``(queries, keys)``: where the model let a query see a key."""
        return self._maps.allowed(_layer_index(layer, len(self)))

    def numpy(self) -> np.ndarray:
        """Every layer at once, ``(layers, heads, queries, keys)`` float32 (layers × heads × queries × keys × 4
        bytes: index a layer instead when that is large). Swin's stages differ in shape: index them."""
        if not self._maps.uniform:
            raise ValueError("this model's layers differ in heads and tokens (Swin's stages): index them, maps[i]")
        return np.stack([self[i] for i in range(len(self))])

    def torch(self) -> "torch.Tensor":
        """``numpy()`` as a torch tensor (on the CPU)."""
        import torch

        return torch.from_numpy(self.numpy())

    def __repr__(self) -> str:
        return (f"<{self.kind} attention: {len(self)} layers × {self._maps.num_heads} heads over "
                f"{len(self._maps.query_tokens)} × {len(self._maps.key_tokens)} tokens>")


def _layer_index(layer: int, layers: int) -> int:
    if not isinstance(layer, (int, np.integer)):
        raise ValueError(f"a layer is an integer, not {layer!r}")
    index = int(layer) + layers if layer < 0 else int(layer)
    if not 0 <= index < layers:
        raise ValueError(f"layer {layer} does not exist: this model has layers 0..{layers - 1}")
    return index


# --- one run --------------------------------------------------------------------------------------------------------

class Exploration:
    """One input through one model: the numbers (``weights``, ``maps``, ``tokens``, ``result``) and every view the
    model's page offers (``head``, ``grid``, ``rollout``, ``lens``, ``explain``, ``focus``, ``generate``, ``step``,
    ``view(name, **options)`` for any of ``views``), drawn by the app's own builders."""

    def __init__(self, family: Family, loaded: LoadedModel, result: RunResult, inputs: Any,
                 borrow: Callable[[], ContextManager]):
        self.family = family
        self.loaded = loaded  # the model as the family runs it (your own object inside, when you passed one)
        self.result = result  # the family's typed result (models/core/results.py): every field the views read
        self.inputs = inputs
        self._borrow = borrow

    # the numbers

    @property
    def tokens(self) -> list[str]:
        """The input's tokens as the views label them (a text's tokens, or [CLS] and "patch (r, c)" for an image)."""
        return list(self.result.tokens)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of attention this run has: ("self",), or ("encoder", "decoder", "cross")."""
        return tuple(self.result.attention)

    @property
    def maps(self) -> Maps:
        """The run's (first kind of) attention, layer by layer: ``maps[layer]`` is ``(heads, queries, keys)``."""
        return self.attention()

    def attention(self, kind: str = "") -> Maps:
        """One kind of attention ("self", "encoder", "decoder", "cross"; "" = the first), layer by layer."""
        return Maps(self.result.maps(kind))

    def weights(self, layer: int, head: int | None = 0, kind: str = "",
                as_torch: bool = False) -> "np.ndarray | torch.Tensor":
        """Attention weights ``(queries, keys)`` float32 of one head of ``layer`` (negative layers count from the
        end), or their mean over heads for ``head=None`` (as the views' "average of heads"); numpy (read-only), or a
        CPU torch tensor with ``as_torch``. Every head at once: ``maps[layer]``."""
        maps = self.result.maps(kind)
        weights = maps.head(_layer_index(layer, maps.num_layers), head)
        if as_torch:
            import torch

            return torch.from_numpy(np.array(weights, dtype=np.float32))
        return weights

    def span(self, phrase: str, occurrence: int = 1) -> tuple[int, int]:
        """The first and last token position of a word or phrase of the input (its ``occurrence``-th appearance):
        a word split into several tokens is one span."""
        from models.core import text

        ids = getattr(self.result, "token_ids", ())
        if self.loaded.tokenizer is None or not ids:
            raise ValueError("this run has no text tokens to find a phrase in; give token positions")
        return text.phrase_span(text.token_pieces(self.loaded.tokenizer, ids), phrase, occurrence)

    @property
    def generated_text(self) -> str:
        return getattr(self.result, "generated_text", "")

    # the figures

    @property
    def views(self) -> tuple[str, ...]:
        """The names of every view this model's page offers (``view(name)`` draws any of them)."""
        return tuple(self.family.views)

    def view(self, name: str, **options) -> Shown:
        """Draw view ``name`` with its options given by name (``view("head", layer=3, head=None)``): the builder the
        page and ``python -m app.cli --view name`` use. A view that needs the model (the lens, explanations,
        ablation, patching, ...) borrows it for the call."""
        if name not in self.family.views:
            raise ValueError(f"the {self.family.name} family has no view {name!r}; it has: {', '.join(self.views)}")
        found = figures.get(name)
        chosen = _options(found.options, options, name)
        if found.run_options and not getattr(self.result, "generation", ()):
            raise ValueError(f"the {name} view draws a generation: run.generate(...) first, then .{_step_hint(name)}")
        data = self.result
        if found.data == "analysis":
            with self._borrow():
                data = found.analysis(self.loaded, self.result, chosen)
        return Shown(found.build(data, chosen))

    def head(self, layer: int = 0, head: int | None = 0, **options) -> Shown:
        """One head of ``layer`` (``head=None``: the average of heads), the page's first figure; hover a token on
        the map's side to light its row (or column), a cell to light its tokens."""
        layers = self.result.maps(options.get("kind", "")).num_layers
        return self.view(self._shortcut("head"), layer=_layer_index(layer, layers), head=head, **options)

    def grid(self, **options) -> Shown:
        """Every head of every layer at once (a ViT: every head of one layer over the image)."""
        return self.view(self._shortcut("grid"), **options)

    def focus(self, query: int | tuple[int, int] | str = -1, layer: int = 0, head: int | None = 0,
              combine: str = "mean", **options) -> Shown:
        """Where one query token looks, as bars over the keys; ``query`` a position, a ``(first, last)`` span or a
        word or phrase of the input (``"Dursley"``: every token of it), its rows taken together by ``combine``
        ("mean": still a distribution; "sum")."""
        if isinstance(query, str):
            query = self.span(query)
        first, last = (query, None) if isinstance(query, (int, np.integer)) else tuple(query)
        return self.view("focus", query=int(first), query_last=None if last is None else int(last), layer=layer,
                         head=head, combine=combine, **options)

    def rollout(self, **options) -> Shown:
        """Attention rollout (Abnar & Zuidema 2020): over the image for a ViT; on text, each input token's rollout
        relevance for the target (the explanation method "rollout")."""
        if "rollout" in self.family.views:
            return self.view("rollout", **options)
        return self.explain("rollout", **options)

    def lens(self, **options) -> Shown:
        """The logit lens: what each layer would predict if the model stopped there."""
        return self.view(self._shortcut("lens"), **options)

    def explain(self, method: str | None = None, **options) -> Shown:
        """With ``method`` (``"gradient_rollout"``, ``"integrated_gradients"``, ...): that explanation's relevance of
        each input token (or patch). Without: every explanation's deletion and insertion curves against random orders,
        with their AUCs, i.e. how faithful each one is (the page's Faithfulness tab)."""
        if method is None:
            return self.view("faithfulness", **options)
        for name in ("token_attribution", "attribution"):
            if name in self.family.views:
                return self.view(name, method=method, **options)
        raise ValueError(f"the {self.family.name} family has no explanation view; it has: {', '.join(self.views)}")

    def faithfulness(self, **options) -> Shown:
        """Every explanation's deletion and insertion curves against random orders (``explain()``)."""
        return self.view("faithfulness", **options)

    def generate(self, **settings) -> "Exploration":
        """Generate a continuation (the family's run options: ``max_new_tokens``, ``strategy`` "greedy" / "beam
        search" / "sampling", ``temperature``, ...), then capture the attention every generated token paid: the new
        run's ``step(n)`` draws the n-th generated token, ``weights`` cover prompt + generation."""
        if self.family.options is None:
            raise ValueError(f"the {self.family.name} family does not generate")
        run_options = _options(self.family.options, settings, "generate")
        with self._borrow():
            result = families.run(self.loaded, self.inputs, run_options)
        _warn(result)
        return Exploration(self.family, self.loaded, result, self.inputs, self._borrow)

    def step(self, step: int = 1, **options) -> Shown:
        """The ``step``-th generated token: where the position that chose it looked, and the candidates; ``layer``,
        ``head`` and the view's other options by name (unset: where the page opens)."""
        name = next((n for n in ("generation_step", "decoding_step", "speech_step") if n in self.family.views), None)
        if name is None:
            raise ValueError(f"the {self.family.name} family does not generate")
        return self.view(name, step=step, **options)

    @property
    def steps(self) -> list[GenerationStep]:
        """Each generated token (``models.core.results.GenerationStep``): its position, text, probability, the
        candidates, and ``query``, the row whose attention chose it."""
        return list(getattr(self.result, "generation", ()))

    def why(self, layer: int, head: int, query: int, key: int, **options) -> Shown:
        """Why ``head`` of ``layer`` puts the weight it does on ``key`` from ``query``: the score split into the
        components that wrote the residual stream (DESIGN.md, "Why a head looks where it does"). Drawn by the "why"
        view (viz/figures/why.py), on the families that offer it (GPT, encoder, ViT)."""
        return self.view("why", layer=layer, head=head, query=query, key=key, **options)

    def _shortcut(self, what: str) -> str:
        for name in SHORTCUTS[what]:
            if name in self.family.views:
                return name
        raise ValueError(f"the {self.family.name} family has no {what} view; it has: {', '.join(self.views)}")

    def __repr__(self) -> str:
        maps = ", ".join(f"{kind} {m.num_layers} layers × {m.num_heads} heads" for kind, m in
                         self.result.attention.items())
        return (f"<{self.family.title}: {self.result.model.key} on {self.result.input_name!r}, "
                f"{len(self.result.tokens)} tokens; {maps}; views: {', '.join(self.views)}>")


def _step_hint(name: str) -> str:
    return "step(1)" if name.endswith("step") else f"view({name!r})"


def _options(cls: type, given: dict[str, Any], what: str) -> Any:
    """An instance of the options dataclass ``cls`` with ``given`` fields set (lists become tuples), the rest at the
    defaults the page opens with; an unknown name is a ValueError naming the known ones."""
    fields = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise ValueError(f"{what} has no option {', '.join(map(repr, unknown))}; it has: "
                         f"{', '.join(sorted(fields)) or 'none'}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})


def _warn(result: RunResult) -> None:
    """What the run changed or cut, as the page's notices say it (a text cut at the token limit, a resized image)."""
    for notice in result.notices:
        warnings.warn(notice, stacklevel=3)


# --- the two ways in ------------------------------------------------------------------------------------------------

Input = Any  # str (a text; an image or audio file or sample name), pathlib.Path, PIL.Image.Image, numpy array


@overload
def explore(model: str | os.PathLike, inputs: Input, /, *, family: str | None = None, device: str | None = None,
            dtype: str = "float32", max_tokens: int | None = None, **run_options) -> Exploration: ...


@overload
def explore(model: Any, processor: Any, inputs: Input, /, *, max_tokens: int | None = None,
            **run_options) -> Exploration: ...


def explore(model, *args, family: str | None = None, device: str | None = None, dtype: str | None = None,
            max_tokens: int | None = None, **run_options) -> Exploration:
    """Run one input through a model and keep everything the app would show.

    ``explore("SmolLM2-135M-Instruct", text)``: a registry key (``families.specs``), a hub id or a local folder (in
    ``ATTN_EXPLORER_MODEL_DIRS``), loaded as the app loads it on ``device`` (default: the best one here) in
    ``dtype``; ``family`` when an id does not say it ("causal_lm", "encoder", "vit", ...).

    ``explore(model, tokenizer, text)``: a transformers or timm model object you hold, run as it is (your dtype, your
    device; a timm ViT takes ``None`` as its processor) and left exactly as found.

    ``inputs``: a text; an image (a PIL image, an RGB uint8 array, a file, or a sample: "cat", "astronaut", "coffee",
    "rocket"); or speech (a file, a sample such as "en quick_brown_fox", or a 16 kHz mono float array).
    ``max_tokens``: a text's token limit (default: the device's, as high as the app allows). Other keywords are the
    family's run options (translation's and speech's settings).
    """
    if isinstance(model, (str, os.PathLike)):
        if len(args) != 1:
            raise TypeError("explore(model_id_or_folder, inputs): give one input")
        loaded = _load(str(model), family, device, dtype or "float32")
        chosen = families.get(loaded.spec.family)
        borrow: Callable[[], ContextManager] = contextlib.nullcontext
        inputs = args[0]
    else:
        if family is not None or device is not None or dtype is not None:
            raise ValueError("a model object is explored as it is: its family follows from its class, and it stays "
                             "on its device in its dtype (move it first with model.to(...))")
        if len(args) not in (1, 2):
            raise TypeError("explore(model, tokenizer_or_processor, inputs)")
        processor, inputs = (None, args[0]) if len(args) == 1 else args
        adopted = families.adopt(model, processor)
        loaded = adopted.loaded
        chosen = families.get(loaded.spec.family)
        borrow = lambda: borrowing.borrowed(adopted.owner, adopted.prepare)  # noqa: E731
    prepared = _inputs(chosen, inputs, loaded, max_tokens)
    options = _options(chosen.options, run_options, "explore") if run_options and chosen.options else None
    if run_options and chosen.options is None:
        raise ValueError(f"the {chosen.name} family takes no run options; unknown: {', '.join(run_options)}")
    with borrow():
        result = families.run(loaded, prepared, options)
    _warn(result)
    return Exploration(chosen, loaded, result, prepared, borrow)


def forget() -> None:
    """Drop the models ``explore`` keeps loaded (the last ``KEPT_MODELS`` loaded by id) and free their memory."""
    _loaded.clear()
    import gc

    gc.collect()


def _load(name: str, family: str | None, device: str | None, dtype: str) -> LoadedModel:
    """A model by registry key, hub id or folder, loaded as the app loads it; the last few stay loaded."""
    spec = _spec(name, family)
    device = device or loading.available_devices()[0]
    key = (spec, device, dtype)
    if key in _loaded:
        _loaded.move_to_end(key)
        return _loaded[key]
    loaded = families.load(spec, device, dtype)
    _loaded[key] = loaded
    while len(_loaded) > KEPT_MODELS:
        _loaded.popitem(last=False)
    return loaded


def _spec(name: str, family: str | None) -> ModelSpec:
    """The declared model called ``name`` (a registry key, any case), else a hub id or folder of ``family`` (read from
    the model's config when not given)."""
    declared = [spec for f in ([family] if family is not None else families.FAMILIES) for spec in families.specs(f)]
    for matches in (lambda key: key == name, lambda key: key.casefold() == name.casefold()):
        found = [spec for spec in declared if matches(spec.key)]
        if found:
            return found[0]
    begins = [spec for spec in declared if spec.key.casefold().startswith(name.casefold()) and spec.offline]
    if len(begins) == 1 and not Path(name).expanduser().exists():  # "SmolLM2", "DINOv2": the one offline model
        return begins[0]
    return families.custom(family or _family_of(name), name)


def registry() -> "pd.DataFrame":
    """Every model the explorer declares, as a table: family, key (what ``explore`` takes), where its weights come
    from (offline: a package or a mini this project trains; hub: a download), its licence and training data."""
    import pandas as pd

    return pd.DataFrame([{"family": spec.family, "key": spec.key, "source": spec.source, "offline": spec.offline,
                          "licence": spec.licence, "trained on": spec.trained_on}
                         for name in families.FAMILIES for spec in families.specs(name)])


# a config's architecture (its class name) -> the family that runs it, first match wins
ARCHITECTURES = (("ForCausalLM", "causal_lm"), ("LMHeadModel", "causal_lm"), ("MTModel", "translation"),
                 ("WhisperFor", "speech"), ("Detr", "detr"), ("ForMaskedLM", "encoder"), ("BertModel", "encoder"),
                 ("ForSequenceClassification", "encoder"), ("ForTokenClassification", "encoder"))


def _family_of(name: str) -> str:
    """The family of an undeclared id or folder, from its config.json (a folder's, or the hub cache's): its
    architecture class for transformers, its architecture name for timm (vit_*, deit_*, swin_*)."""
    import json

    config = None
    folder = Path(name).expanduser()
    path = folder / "config.json" if folder.is_dir() else None
    if path is None:
        with contextlib.suppress(Exception):
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
            path = Path(cached) if isinstance(cached, str) else None
    if path is not None and path.is_file():
        with contextlib.suppress(OSError, ValueError):
            config = json.loads(path.read_text())
    known = ", ".join(families.FAMILIES)
    if config is None:
        raise ValueError(f"{name!r} is not a model of the registry and its config.json cannot be read here (no "
                         f"folder, not in the hub cache): say which family runs it, explore(..., family=...), one "
                         f"of {known}")
    architecture = str((config.get("architectures") or [config.get("architecture", "")])[0])
    timm_name = architecture.lower()
    if timm_name.startswith(("vit_", "deit_", "eva_")):
        return "vit"
    if timm_name.startswith("swin"):
        return "swin"
    for fragment, found in ARCHITECTURES:
        if fragment in architecture:
            return found
    raise ValueError(f"{name!r} is a {architecture or 'model of an unknown architecture'}; say which family runs "
                     f"it, explore(..., family=...), one of {known}")


def _inputs(family: Family, value: Any, loaded: LoadedModel, max_tokens: int | None):
    """What the user passed as the family's input (TextInput, ImageInput, AudioInput), checked as the page checks
    an upload."""
    from models.core import inputs as core_inputs
    from models.core import limits

    if isinstance(value, (core_inputs.TextInput, core_inputs.ImageInput, core_inputs.AudioInput)):
        return value
    if family.input is core_inputs.TextInput:
        if isinstance(value, Path):
            from models.core import text

            value = text.decode_upload(value.read_bytes())
        if not isinstance(value, str):
            raise ValueError(f"a {family.title} reads a text (a str), not a {type(value).__name__}")
        # the translation page's source limit (its minis are trained on short sentences); elsewhere the device's
        limit = max_tokens or (TRANSLATION_TOKENS if family.name == "translation" else limits.max_tokens(loaded.device))
        return core_inputs.TextInput(value, limit)
    if max_tokens is not None:
        raise ValueError(f"max_tokens is a text's token limit; a {family.title} reads no text")
    if family.input is core_inputs.ImageInput:
        return _image(value)
    if family.input is core_inputs.AudioInput:
        return _audio(value)
    raise ValueError(f"the explorer cannot make a {family.input.__name__} from a {type(value).__name__}")


def _image(value: Any):
    from PIL import Image

    from models.core import images
    from models.core.inputs import ImageInput

    if isinstance(value, str) and value in images.SAMPLES:
        return ImageInput(images.load_sample(value), f"sample {value}")
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"{str(value)!r} is neither a sample image ({', '.join(images.sample_names())}) nor a "
                             "file")
        return ImageInput(images.decode_image(path.read_bytes(), f"the file {path.name!r}"), path.stem)
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")  # through the upload's checks: size limits, mode, orientation
        return ImageInput(images.decode_image(buffer.getvalue(), "the image"), "image")
    if isinstance(value, np.ndarray):
        return ImageInput(images.from_array(value), "image")
    raise ValueError(f"an image is a PIL image, an RGB uint8 array, a file or a sample name, not a "
                     f"{type(value).__name__}")


def _audio(value: Any):
    from models.core import audio
    from models.core.inputs import AudioInput
    from models.families.speech import model as speech

    if isinstance(value, (str, os.PathLike)):
        if str(value) in speech.samples():
            return speech.sample_input(str(value))
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"{str(value)!r} is neither a sample clip ({', '.join(speech.samples())}) nor a file")
        return AudioInput(audio.decode(path.read_bytes(), path.stem))
    if isinstance(value, np.ndarray):
        import soundfile

        buffer = io.BytesIO()  # through the upload's decoding: mono, 16 kHz, at most 30 s
        soundfile.write(buffer, np.asarray(value, dtype=np.float32), audio.SAMPLE_RATE, format="WAV")
        return AudioInput(audio.decode(buffer.getvalue(), "audio"))
    raise ValueError(f"speech is a file, a sample name or a 16 kHz mono float array, not a {type(value).__name__}")
