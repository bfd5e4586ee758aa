"""Every registered explanation method (models/analysis/attribution.py's ``METHODS``) on every
family that declares an explainer, through its own adapter on a small offline model: a method the
adapter offers gives one finite score per unit, one it does not is refused in words. Every method is
offered somewhere, and a new family with an explainer must join this test."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from models import families
from models.analysis import attribution
from models.analysis import explanations as explainable
from models.analysis.methods import METHODS, SHARED
from models.core.inputs import ImageInput, TextInput
from models.minis.captioning import scenes
from models.minis.vit_shapes import data
from tests.conftest import save_tiny


def _mini(family: str, key: str | None = None):
    return families.load(next(s for s in families.specs(family) if s.source == "mini" and
                              (key is None or s.id == key)))


def _picture(seed: int = 7) -> ImageInput:
    return ImageInput(Image.fromarray(data.make_sample(np.random.default_rng(seed)).image), "shape")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """family -> [(what, Explainable)]: one adapter per geometry the family has."""
    torch.manual_seed(0)
    found: dict[str, list] = {}
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("registry")
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(root))
        for family, kind, text in (("causal_lm", "llama", "the cat sat on the mat and the dog"),
                                   ("encoder", "bert", "the cat sat on the warm mat")):
            loaded = families.load(families.custom(family, str(save_tiny(kind, root / kind))))
            result = families.run(loaded, TextInput(text, 32))
            found[family] = [(kind, explainable.explainable(loaded, result, None))]
    translator = _mini("translation", "translation/transformer")
    sentence = TextInput("The national green plan has adopted a commission.", 32)
    result = families.run(translator, sentence)
    found["translation"] = [("transformer", explainable.explainable(translator, result, 1))]
    for family in ("vit", "swin"):
        loaded = _mini(family)
        result = families.run(loaded, _picture())
        found[family] = [(family, explainable.explainable(loaded, result, None))]
    scene = ImageInput(Image.fromarray(scenes.page_scene(56).image), "scene 56")
    found["captioning"] = []
    for spec in families.specs("captioning"):
        if spec.source == "mini":
            loaded = families.load(spec)
            result = families.run(loaded, scene)
            found["captioning"].append((spec.id, explainable.explainable(loaded, result, 1)))
    return found


def test_every_family_with_an_explainer_is_here(adapters):
    assert set(adapters) == {name for name, family in families.FAMILIES.items() if family.explainer}


@pytest.mark.parametrize("family",
                         ["causal_lm", "encoder", "translation", "vit", "swin", "captioning"])
def test_every_registered_method_runs_or_is_refused_in_words(adapters, family):
    for what, ex in adapters[family]:
        for name, method in METHODS.items():
            needed = method.needs is None or getattr(ex, method.needs) is not None
            offered = name in ex.methods and needed
            if not offered:
                with pytest.raises(ValueError, match=f"{name} is not available"):
                    attribution.explain(ex, (name,), ig_steps=2)
                continue
            found = attribution.explain(ex, (name,), ig_steps=2)
            scores = found.scores[name]
            assert scores.shape == (len(ex.units),) and scores.dtype == np.float32, (what, name)
            assert np.isfinite(scores).all(), (what, name)
            assert found.seconds[name] >= 0 and np.isfinite(found.probability), (what, name)


def test_the_cli_lists_every_method():
    from app import cli

    listed = cli.listing().split("\n--method (", 1)[1]
    assert all(f"    {name}: {method.what}" in listed for name, method in METHODS.items())


def test_every_registered_method_is_offered_somewhere(adapters):
    offered = {name for listed in adapters.values() for _, ex in listed for name in ex.methods}
    assert offered == set(METHODS)
    assert attribution.check_methods(SHARED) == SHARED
    with pytest.raises(ValueError, match="unknown method"):
        attribution.check_methods(("attention_flow",))
