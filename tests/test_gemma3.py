"""Gemma 3 (issue 39): sliding-window (local) and global layers drawn as the masks they are and labelled as such,
on a tiny random Gemma 3 (cheap) and on the packaged Gemma 3 270M's real weights (one load for the module: its
first conversion, about a minute, happens once per machine and CI run, in the local cache)."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from models import families
from models.core import capture
from models.core.inputs import TextInput
from models.core.results import DescribedMask
from models.families.causal_lm import model as causal_lm

WINDOW = 4  # the tiny model's sliding window, so that 12 tokens already leave the local layers' reach


def tiny_gemma3(implementation: str):
    import transformers

    capture.register()
    config = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, sliding_window=WINDOW, max_position_embeddings=256,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}})
    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM._from_config(config, attn_implementation=implementation).eval()


@pytest.fixture(scope="module")
def tiny_run():
    """The tiny model's capture maps and its own eager maps on 12 tokens (longer than its window)."""
    model = tiny_gemma3(capture.ATTENTION_NAME)
    eager = tiny_gemma3("eager")
    ids = torch.arange(1, 13)[None]
    with torch.inference_mode(), capture.recording(model) as recorder:
        model(input_ids=ids)
    with torch.inference_mode():
        reference = eager(input_ids=ids, output_attentions=True).attentions
    return recorder.attention_maps("self"), [layer[0].numpy() for layer in reference], model.config


def test_tiny_gemma3_maps_equal_eager_with_the_window_as_a_rule(tiny_run):
    maps, reference, config = tiny_run
    for layer, expected in enumerate(reference):
        np.testing.assert_allclose(maps.layer(layer), expected, atol=1e-6, err_msg=f"layer {layer}")
        mask = maps.allowed_masks[maps.mask_index[layer]]
        assert isinstance(mask, DescribedMask), f"layer {layer}: the mask was kept as an array"
        local = config.layer_types[layer] == "sliding_attention"
        assert mask.window == (WINDOW if local else 0), layer
        assert (expected[:, -1, :12 - WINDOW] == 0).all() == local  # the last query cannot see the start


def test_layers_say_whether_they_are_local_or_global(tiny_run):
    maps, _, config = tiny_run
    assert [maps.layer_window(i) for i in range(6)] == [WINDOW] * 5 + [0]
    assert maps.layer_label(4) == f"layer 4 (local, {WINDOW})"
    assert maps.layer_label(5) == "layer 5 (global)"


def test_a_model_without_windows_labels_its_layers_by_number_only():
    from tests.conftest import tiny_model

    model = tiny_model("llama")
    with torch.inference_mode(), capture.recording(model) as recorder:
        model(input_ids=torch.arange(1, 9)[None])
    maps = recorder.attention_maps("self")
    assert maps.layer_window(1) == 0 and maps.layer_label(1) == "layer 1"


# --- the packaged chunks ---------------------------------------------------------------------------------------------

def test_chunks_are_joined_in_order_and_checked_against_the_sha256(tmp_path):
    chunks = []
    for i, data in enumerate((b"GGUF", b"\x03\x00", b"rest of the file")):
        chunks.append(tmp_path / f"part{i:02d}")
        chunks[-1].write_bytes(data)
    whole = b"GGUF\x03\x00rest of the file"
    joined = causal_lm.join_chunks(chunks, tmp_path / "model.gguf", hashlib.sha256(whole).hexdigest())
    assert joined.read_bytes() == whole
    with pytest.raises(ValueError, match="Reinstall"):
        causal_lm.join_chunks(chunks[::-1], tmp_path / "wrong.gguf", hashlib.sha256(whole).hexdigest())
    assert not (tmp_path / "wrong.gguf").exists()  # nothing half-right is left to load


def test_the_sha256_is_the_packages_own():
    assert causal_lm.gemma3_sha256() == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


# --- the real weights --------------------------------------------------------------------------------------------------

SPEC_KEY = "Gemma-3-270M"


@pytest.fixture(scope="module")
def gemma():
    return families.load(families.spec("causal_lm", SPEC_KEY))


@pytest.fixture(scope="module")
def gemma_eager(gemma):
    """Gemma 3 270M's own eager attention on the same converted weights (the reference)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        causal_lm.gemma3_folder(), attn_implementation="eager", dtype=torch.float32).eval()


def _eager_maps(model, ids) -> list[np.ndarray]:
    with torch.inference_mode():
        return [layer[0].numpy() for layer in model(input_ids=torch.tensor([ids]), output_attentions=True).attentions]


def test_gemma3_270m_is_labelled_and_sees_paris(gemma):
    assert families.default_spec("causal_lm").key != SPEC_KEY  # SmolLM2 stays the page's default
    assert "Gemma Terms of Use" in gemma.spec.licence and "6 trillion tokens" in gemma.spec.trained_on
    folder = causal_lm.gemma3_folder()
    assert "ai.google.dev/gemma/terms" in (folder / "NOTICE").read_text()
    assert not list(folder.glob("*.gguf"))  # the joined GGUF is not kept beside its float32 copy
    result = causal_lm.run(gemma, TextInput("The Eiffel Tower is in the city of"))
    assert result.next_token[0].token == "␣Paris" and 0.45 < result.next_token[0].probability < 0.55


def test_gemma3_270m_maps_equal_its_eager_attention(gemma, gemma_eager):
    result = causal_lm.run(gemma, TextInput("The Eiffel Tower is in the city of"))
    maps = result.maps("self")
    assert (maps.num_layers, maps.num_heads, maps.num_kv_heads) == (18, 4, 1)
    reference = _eager_maps(gemma_eager, list(result.token_ids))
    worst = max(float(np.abs(maps.layer(i) - reference[i]).max()) for i in range(18))
    assert worst < 1e-5, worst
    labels = [maps.layer_label(i) for i in range(18)]
    assert labels[4] == "layer 4 (local, 512)" and labels[5] == "layer 5 (global)"
    assert sum("global" in label for label in labels) == 3


def test_gemma3_270m_local_heads_stop_512_tokens_back(gemma, gemma_eager):
    """The GPT page's long sample: past 512 tokens the local layers' windows are drawn as the rule they are, and
    every map still equals the model's own eager attention."""
    from app.views.gpt import SAMPLES

    sample = SAMPLES["Beyond the window"]
    result = causal_lm.run(gemma, TextInput(sample.text, sample.max_tokens))
    n = len(result.tokens)
    assert 512 < n <= sample.max_tokens and not result.notices
    maps = result.maps("self")
    reference = _eager_maps(gemma_eager, list(result.token_ids))
    worst = max(float(np.abs(maps.layer(i) - reference[i]).max()) for i in range(18))
    assert worst < 1e-5, worst
    local, full = maps.row(4, None, n - 1), maps.row(5, None, n - 1)
    assert (local[:n - 512] == 0).all() and (local[n - 512:] > 0).all()
    assert (full > 0).all()
    assert maps.allowed_masks[maps.mask_index[4]].window == 512
    assert result.next_token[0].token.strip() == sample.key  # the name, read from beyond the local window
