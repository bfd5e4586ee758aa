"""Activation patching (models/analysis/patching.py, viz/figures/patching.py): patching nothing recovers 0%, patching
the whole clean stream recovers 100%, each batched patch equals that patch done by hand, positions the corruption
cannot reach recover nothing, and mismatched prompts or answers are messages."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models import families
from models.analysis import ablation, patching
from models.core import text
from models.core.inputs import TextInput
from tests.conftest import ROOT, check_files, save_tiny
from viz import figures
from viz.figures.patching import PatchingOptions

CLEAN, CORRUPT = "the cat sat on the mat and the dog sat on the", "the cat sat on the rug and the dog sat on the"
OPTIONS = PatchingOptions(CORRUPT, clean_answer="mat", corrupted_answer="rug")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny(request, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        folder = save_tiny(request.param, tmp_path_factory.mktemp("patching") / request.param)
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
        loaded = families.load(families.custom("causal_lm", str(folder)))
        result = families.run(loaded, TextInput(CLEAN, 64))
        yield loaded, result, patching.activation_patching(loaded, result, OPTIONS)


def logit_difference(loaded, ids, good: int, bad: int, hook_at=None, hook=None) -> float:
    """LD after ``ids`` in one unbatched forward, with ``hook`` as a forward hook on module ``hook_at``."""
    handle = hook_at.register_forward_hook(hook) if hook_at is not None else None
    try:
        with torch.inference_mode():
            logits = loaded.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    finally:
        if handle is not None:
            handle.remove()
    return float(logits[good] - logits[bad])


def ids_and_answers(loaded):
    tokenizer = loaded.tokenizer
    return (text.tokenize(tokenizer, CLEAN, 64).ids, text.tokenize(tokenizer, CORRUPT, 64).ids,
            tokenizer.convert_tokens_to_ids("mat"), tokenizer.convert_tokens_to_ids("rug"))


def changed_position(found) -> int:
    (at,) = [i for i, (a, b) in enumerate(zip(found.clean_tokens, found.corrupted_tokens)) if a != b]
    return at


def test_patching_nothing_recovers_none_and_everything_recovers_all(tiny):
    loaded, result, found = tiny
    clean_ids, corrupt_ids, good, bad = ids_and_answers(loaded)
    assert found.clean_difference == pytest.approx(logit_difference(loaded, clean_ids, good, bad), abs=1e-4)
    assert found.corrupted_difference == pytest.approx(logit_difference(loaded, corrupt_ids, good, bad), abs=1e-4)
    stream = patching.clean_stream(loaded.model, clean_ids, {})
    everything = list(range(len(clean_ids)))
    corrupted = torch.tensor([corrupt_ids] * 3)
    with patching.residual_patched(loaded.model, [(-1, -1), (0, everything), (len(stream) - 1, everything)], stream):
        with torch.inference_mode():
            last = loaded.model(input_ids=corrupted, use_cache=False).logits[:, -1].float()
    values = (last[:, good] - last[:, bad]).numpy()
    fractions = (values - found.corrupted_difference) / (found.clean_difference - found.corrupted_difference)
    np.testing.assert_allclose(fractions, [0.0, 1.0, 1.0], atol=1e-4)


def test_the_map_has_one_row_per_point_and_reads_as_expected(tiny):
    loaded, result, found = tiny
    layers = loaded.model.config.num_hidden_layers
    assert found.residual.shape == (layers + 1, len(result.tokens))
    assert found.heads.shape == (layers, loaded.model.config.num_attention_heads)
    at = changed_position(found)
    assert (found.clean_tokens[at], found.corrupted_tokens[at]) == ("mat", "rug")
    np.testing.assert_allclose(found.residual[:, :at], 0.0, atol=1e-3)  # before the change nothing differs (causal)
    assert found.residual[-1, -1] == pytest.approx(1.0, abs=1e-4)  # the last position after the last layer: all
    assert found.residual[0, at] == pytest.approx(1.0, abs=1e-4)  # the changed token's embedding: all of it


def test_a_batched_residual_patch_equals_the_patch_by_hand(tiny):
    loaded, result, found = tiny
    clean_ids, corrupt_ids, good, bad = ids_and_answers(loaded)
    layers = patching.decoder_layers(loaded.model)
    at = changed_position(found)
    kept = {}

    def keep(module, args, output):
        kept["x"] = (output[0] if isinstance(output, tuple) else output).clone()

    handle = layers[0].register_forward_hook(keep)  # the clean output of block 1 (point 1), by an independent hook
    with torch.inference_mode():
        loaded.model(input_ids=torch.tensor([clean_ids]), use_cache=False)
    handle.remove()

    def put(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[0, at] = kept["x"][0, at]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    value = logit_difference(loaded, corrupt_ids, good, bad, layers[0], put)
    expected = (value - found.corrupted_difference) / (found.clean_difference - found.corrupted_difference)
    assert found.residual[1, at] == pytest.approx(expected, abs=1e-4)


def test_a_batched_head_patch_equals_the_patch_by_hand(tiny):
    loaded, result, found = tiny
    clean_ids, corrupt_ids, good, bad = ids_and_answers(loaded)
    projection = ablation.output_projections(loaded.model)[1]
    heads = loaded.model.config.num_attention_heads
    kept = {}
    handle = projection.register_forward_pre_hook(lambda m, args: kept.setdefault("x", args[0].clone()))
    with torch.inference_mode():
        loaded.model(input_ids=torch.tensor([clean_ids]), use_cache=False)
    handle.remove()
    width = kept["x"].shape[-1] // heads

    def put(module, args):
        hidden = args[0].clone()
        hidden[..., 3 * width:4 * width] = kept["x"][..., 3 * width:4 * width]
        return (hidden,)

    handle = projection.register_forward_pre_hook(put)
    try:
        value = logit_difference(loaded, corrupt_ids, good, bad)
    finally:
        handle.remove()
    expected = (value - found.corrupted_difference) / (found.clean_difference - found.corrupted_difference)
    assert found.heads[1, 3] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("options, says", [
    (PatchingOptions("the cat sat on the big red mat and the dog sat on the"), "same number of tokens"),
    (PatchingOptions(""), "type a corrupted prompt"),
    (PatchingOptions(CORRUPT, clean_answer="mat", corrupted_answer="mat"), "same answer"),
    (PatchingOptions(CORRUPT, clean_answer="catastrophically", corrupted_answer="rug"), "must be one token"),
])
def test_bad_prompts_or_answers_are_messages(tiny, options, says):
    loaded, result, _ = tiny
    with pytest.raises(ValueError, match=says):
        patching.activation_patching(loaded, result, options)


def test_files_and_cli(tiny, tmp_path):
    from app import cli

    loaded, result, found = tiny
    payload = json.loads(check_files(figures.build("patching", found, OPTIONS))["json"])
    np.testing.assert_allclose(payload["residual"], found.residual, atol=1e-6)
    assert payload["clean_answer"] == "mat" and payload["corrupted_answer"] == "rug"
    assert cli.main(["--page", "gpt", "--model", loaded.spec.id, "--text", CLEAN, "--view", "patching", "--corrupt",
                     CORRUPT, "--clean_answer", "mat", "--corrupted_answer", "rug", "--format", "json", "--out",
                     str(tmp_path)]) == 0
    (written,) = tmp_path.glob("*.json")
    assert np.asarray(json.loads(written.read_text())["heads"]).shape == found.heads.shape


def test_the_gpt_page_patches_a_typed_pair(patched_loader):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=120)
    at.query_params.update({"gpt_tab": "Patching", "gpt_text": CLEAN, "gpt_patch_corrupt": CORRUPT,
                            "gpt_patch_clean_answer": "mat", "gpt_patch_corrupted_answer": "rug"})
    at.run()
    assert not at.exception, at.exception
    assert any("Logit difference logit('mat')" in caption.value for caption in at.caption)
    at.text_input(key="gpt_patch_corrupt").set_value("a <b>much</b> longer corrupted prompt than the clean one").run()
    assert not at.exception, at.exception
    assert any("same number of tokens" in error.value for error in at.error)
