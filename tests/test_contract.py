"""The contract every family keeps, checked on every registered family's offline model (DESIGN.md, "One result
contract"; docs/ARCHITECTURE.md): typed frozen results; attention per layer float32 ``(heads, queries, keys)`` with
rows summing to 1 and masked entries exactly 0; and every view the family declares builds its figure, with files
whose names say what they hold. Pages: every page in the catalog exists, and every page file is in the catalog."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from app import catalog
from models import families
from models.core import images
from models.core.inputs import AudioInput, ImageInput, TextInput
from viz import export, figures


def _page_of(family: str) -> catalog.Page:
    return next(page for page in catalog.PAGES if page.family == family)


def _inputs(family):
    page = _page_of(family.name)
    if family.input is ImageInput:
        return ImageInput(images.load_sample(page.sample), f"sample {page.sample}")
    if family.input is AudioInput:
        from models.families.speech import model as speech

        return speech.sample_input(page.sample)
    return TextInput(page.sample, 128 if family.name == "translation" else 64)


OFFLINE = [(spec.family, spec.key) for name in sorted(families.FAMILIES) for spec in families.specs(name)
           if spec.offline]


@pytest.fixture(scope="module")
def runs():
    """(family, loaded, result) per offline model, loaded and run once for the whole module."""
    cache = {}

    def get(family_name: str, key: str):
        if (family_name, key) not in cache:
            family = families.get(family_name)
            loaded = families.load(families.spec(family_name, key))
            cache[family_name, key] = family, loaded, families.run(loaded, _inputs(family))
        return cache[family_name, key]

    return get


@pytest.fixture(scope="module", params=OFFLINE, ids=[f"{family}:{key}" for family, key in OFFLINE])
def family_run(request, runs):
    """(family, loaded, result) for each offline model (packages and minis) on its page's sample input."""
    return runs(*request.param)


def test_every_family_has_an_offline_model_and_a_page():
    for name in families.FAMILIES:
        assert families.default_spec(name).offline
        assert _page_of(name).file.is_file()


def test_result_is_the_familys_typed_frozen_result(family_run):
    family, loaded, result = family_run
    assert isinstance(result, family.result)
    assert result.model == loaded.info() and result.model.family == family.name
    assert result.run_id and result.input_name
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.tokens = []  # type: ignore[misc]
    assert not hasattr(result, "extras")
    for field in dataclasses.fields(result):  # every field a view reads is named and typed: no bag of string keys
        assert field.type not in ("dict", "dict[str, Any]"), field.name


def test_attention_keeps_the_contract(family_run):
    family, _, result = family_run
    for kind, maps in result.attention.items():
        assert maps.kind == kind
        for layer in range(maps.num_layers):
            weights = maps.layer(layer)
            query_tokens, key_tokens = maps.tokens_in(layer)
            assert weights.shape == (maps.heads_in(layer), len(query_tokens), len(key_tokens)), (kind, layer)
            assert weights.dtype == np.float32 and not weights.flags.writeable
            allowed = maps.allowed(layer)
            assert allowed.shape == weights.shape[1:] and allowed.dtype == bool
            assert np.all(weights[:, ~allowed] == 0.0), f"{family.name} {kind} layer {layer}: masked entries not 0"
            rows = weights.sum(axis=-1)
            seeing = allowed.any(axis=-1)  # a query that may see no key (padding) has an all-zero row
            np.testing.assert_allclose(rows[:, seeing], 1.0, atol=1e-4, err_msg=f"{kind} layer {layer}")
            assert np.all(rows[:, ~seeing] == 0.0)
            head = maps.head(layer, 0)
            np.testing.assert_allclose(head, weights[0], atol=1e-6)  # one head recomputed alone is the same
            if maps.uniform:
                assert maps.heads_in(layer) == maps.num_heads
                assert (query_tokens, key_tokens) == (maps.query_tokens, maps.key_tokens)
            if layer >= 3 and family.name == "swin":
                break  # the later Swin blocks repeat the checks at more cost


def _figure(view, family, loaded, result):
    options = view.options()
    cheaper = {field: value for field, value in CHEAPER.items() if field in {f.name for f in view.option_fields()}}
    options = dataclasses.replace(options, **cheaper) if cheaper else options
    data = result
    if view.run_options:  # e.g. a generation: the family's run options at their defaults
        data = families.run(loaded, _inputs(family), family.options())
    if view.example is not None:  # the defaults need a second input (a corrupted prompt): the view's own example
        example_text, options = view.example
        data = families.run(loaded, TextInput(example_text, 64))
    if view.data == "analysis":  # views sharing an analysis share its result, as the app's cache does
        key = (id(loaded), id(data), view.analysis_key(options))
        if key not in _ANALYSES:
            read: set[str] = set()
            analysed = view.analysis(loaded, data, _reading(options, read))
            unkeyed = read - set(view.analysis_options)
            assert not unkeyed, (f"{view.name}'s analysis reads {sorted(unkeyed)}, which its cache key "
                                 f"(analysis_options) leaves out: a stale analysis would come back for new values")
            _ANALYSES[key] = (data, analysed)  # (the run kept alive: its id stays its)
        data = _ANALYSES[key][1]
    return view.build(data, options)


_ANALYSES: dict = {}


def _reading(options, read: set):
    """A copy of ``options`` that notes in ``read`` every field the code reads (the analysis cache-key contract:
    ``View.analysis_key`` keys an analysis by ``analysis_options`` only)."""
    names = {field.name for field in dataclasses.fields(options)}

    class Reading(type(options)):
        def __getattribute__(self, name):
            if name in names:
                read.add(name)
            return super().__getattribute__(name)

    Reading.__name__ = type(options).__name__
    made = Reading(**{name: getattr(options, name) for name in names})
    read.clear()  # what making it read (``selection.checked`` checks layer and head) is not the analysis reading
    return made


# one test per (family, view), each with its own time limit: the language model's analyses (every head ablated, every
# position patched) each run hundreds of SmolLM2 forwards, and together they outlast one test's limit on a busy machine
DECLARED_VIEWS = [(name, view) for name in sorted(families.FAMILIES) for view in families.get(name).views]
# fewer curve points, random orders and IG steps than the page's defaults: the same code paths, a fraction of the work
CHEAPER = {"steps": 5, "seeds": 2, "ig_steps": 8, "images": 8}


def test_every_family_declares_views():
    for name in families.FAMILIES:
        assert families.get(name).views, f"{name} declares no views"


@pytest.mark.parametrize("family_name, name", DECLARED_VIEWS, ids=[f"{f}:{v}" for f, v in DECLARED_VIEWS])
def test_every_declared_view_builds_its_figure(family_name, name, runs):
    """Each view a family declares draws a figure from at least one of its offline models (a view may not apply to
    every model: the DINOv2 backbone has no class to attribute, the fixed-context GRU no attention); where it does
    not apply it says so as a ValueError, the message a page shows."""
    family = families.get(family_name)
    specs = [key for fam, key in OFFLINE if fam == family_name]
    view = figures.get(name)  # an undeclared name fails here
    built, refused = [], []
    for key in specs:
        _, loaded, result = runs(family_name, key)
        try:
            figure = _figure(view, family, loaded, result)
        except ValueError as error:
            assert str(error).strip(), f"{name} on {key}: an empty message"
            refused.append(key)
            continue
        built.append(key)
        assert re.fullmatch(r"[a-z0-9_-]+", figure.stem), (name, figure.stem)
        assert figure.shown(), f"{name}: nothing drawn"
        offered = {offer.format for offer in export.offers(figure)}
        assert "png" in offered and offered <= set(export.FORMATS), (name, offered)
    assert built, f"the {name} view drew nothing on any offline {family_name} model (refused on {refused})"


def test_views_of_pages_without_a_family_build_from_their_defaults():
    for page in catalog.PAGES:
        if page.family is not None or page.name == "corpus":  # a corpus run's figures: tests/test_corpus*.py
            continue
        views = figures.page_views(page.name)
        assert views, f"the {page.name} page owns no views"
        for view in views:
            if view.family is not None or view.name == "kv_cache":
                continue  # views that read a model's tensors (or every model's config) are built by the page's tests
            options = view.options()
            data = view.analysis(None, None, options) if view.data == "analysis" else None  # a lesson's own model
            figure = view.build(data, options)
            assert figure.shown() and re.fullmatch(r"[a-z0-9_-]+", figure.stem), view.name


def test_every_page_exists_and_every_page_file_is_routed():
    """A deleted page file fails here (the navigation never hides a missing page), and a page file nobody routes
    is an orphan."""
    for page in catalog.PAGES:
        assert page.file.is_file(), f"app/views/{page.name}.py is missing"
    routed = {page.file.name for page in catalog.PAGES}
    files = {path.name for path in catalog.VIEWS_DIR.glob("*.py") if path.name != "__init__.py"}
    assert files == routed, f"page files not in app/catalog.py: {sorted(files - routed)}"


