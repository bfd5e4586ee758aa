"""Models users bring: what their attention function is handed is honoured exactly, or refused in words before the
run (issue 36). Soft-capped scores (Gemma 2), attention sinks (gpt-oss), and a keyword nobody taught the capture.

The support matrix (tests/test_support_matrix.py) runs every architecture; these are the cases the issue names,
each checked through the page's own path against transformers' eager attention, maps and next-token distribution.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests import support_matrix

TOLERANCE = 1e-5


@pytest.fixture()
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    support_matrix.quiet()
    return tmp_path


def _page_run(folder, page="causal_lm"):
    from models import families
    from models.core.inputs import TextInput

    loaded = families.load(families.custom(page, str(folder)))
    return loaded, families.run(loaded, TextInput(support_matrix.TEXT, 64))


@pytest.mark.parametrize("model_type", ["gpt_oss", "gemma2"])
def test_sinks_and_soft_caps_are_drawn_and_run_as_the_model_does(model_dir, model_type):
    folder = model_dir / model_type
    support_matrix.build("causal_lm", model_type, folder)
    loaded, result = _page_run(folder)
    reference, probabilities = support_matrix._eager("causal_lm", folder, list(result.token_ids))
    reference = reference["self"]
    maps = result.attention["self"]
    assert maps.num_layers == len(reference) == 2
    for layer in range(maps.num_layers):
        np.testing.assert_allclose(maps.layer(layer), reference[maps.layer_number(layer)], atol=TOLERANCE, rtol=0)
    drawn = np.array([t.probability for t in result.next_token])
    np.testing.assert_allclose(np.log(drawn), np.log(probabilities[[t.token_id for t in result.next_token]]),
                               atol=support_matrix.LOG_TOLERANCE, rtol=0)
    if model_type == "gpt_oss":  # every row's sink share is what its keys left
        assert maps.has_sinks
        for layer in range(maps.num_layers):
            share = maps.sink_share(layer, 1)
            np.testing.assert_allclose(share, 1 - maps.layer(layer)[1].sum(-1), atol=1e-6)
            assert (share > 0).all()
        assert "attention sinks" in loaded.capture
    else:
        assert not maps.has_sinks and "soft-capped" in loaded.capture


def test_a_keyword_the_capture_does_not_know_is_refused_before_any_output(model_dir, monkeypatch):
    """A future architecture hands its attention function something new: the run stops at the first attention
    call with the architecture and the keyword named, and no output comes back."""
    import transformers.models.llama.modeling_llama as llama

    folder = model_dir / "llama"
    support_matrix.build("causal_lm", "llama", folder)
    from models import families
    from models.core.inputs import TextInput

    loaded = families.load(families.custom("causal_lm", str(folder)))
    original = llama.LlamaAttention.forward

    def forward(self, *args, **kwargs):
        return original(self, *args, **{**kwargs, "learned_temperature": torch.ones(1)})

    monkeypatch.setattr(llama.LlamaAttention, "forward", forward)
    with pytest.raises(ValueError, match=r"llama hands its attention function 'learned_temperature'"):
        families.run(loaded, TextInput(support_matrix.TEXT, 64))


def test_a_model_in_training_mode_is_refused_rather_than_drawn_with_dropout():
    from models.core import capture

    module = torch.nn.Module()
    module.train()
    with pytest.raises(ValueError, match="training mode"):
        capture.check_keywords(module, {"dropout": 0.1, "scaling": 0.25})
    module.eval()
    capture.check_keywords(module, {"dropout": 0.1, "scaling": 0.25, "use_cache": False})


def test_a_model_spread_over_devices_with_disk_offload_captures_exactly(model_dir):
    """accelerate's device_map (here the CPU and a disk offload, what a CPU machine has): each layer's weights are
    brought in by accelerate's hooks around its forward, and the capture inside the attention call sees the same
    q and k as anywhere else."""
    import transformers

    from models.core import capture

    folder = model_dir / "llama"
    support_matrix.build("causal_lm", "llama", folder)
    capture.register()
    spread = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation=capture.ATTENTION_NAME, offload_folder=str(model_dir / "offload"),
        device_map={"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                    "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}).eval()
    assert {"cpu", "disk"} <= set(spread.hf_device_map.values())
    ids = list(range(101, 117))
    with torch.inference_mode(), capture.recording(spread) as recorder:
        spread(input_ids=torch.tensor([ids]), use_cache=False)
    maps = recorder.attention_maps("self")
    reference, _ = support_matrix._eager("causal_lm", folder, ids)
    assert maps.num_layers == 2
    for layer in range(2):
        np.testing.assert_allclose(maps.layer(layer), reference["self"][layer], atol=TOLERANCE, rtol=0)


def test_a_memory_check_that_cannot_count_says_so(model_dir, monkeypatch, caplog):
    """The load goes on without the check, and the page is told why (issue 40: errors keep their cause)."""
    from models import families
    from models.core import memory_fit

    folder = model_dir / "llama"
    support_matrix.build("causal_lm", "llama", folder)

    def broken(model_class, config):
        raise RuntimeError("a config only its own class understands")

    monkeypatch.setattr(memory_fit, "_meta_parameters", broken)
    monkeypatch.setattr(memory_fit, "_safetensors_parameters", lambda folder: None)  # no headers to count from
    with caplog.at_level("WARNING"):
        loaded = families.load(families.custom("causal_lm", str(folder)))
    assert any("could not count this model's parameters" in note and "RuntimeError" in note
               for note in loaded.notes)
    assert "a config only its own class understands" in caplog.text


def test_a_model_reading_audio_beside_its_text_is_drawn_on_text_or_refused_in_words(model_dir):
    """Qwen2-Audio's text decoder runs on text alone (the page says its audio encoder did not run);
    Voxtral Realtime's does not, and the page says so before any run, not in transformers' words."""
    import copy

    import transformers

    from tests.conftest import minilm_tokenizer

    folder = model_dir / "qwen2_audio"
    support_matrix.build("causal_lm", "qwen2_audio", folder)
    loaded, result = _page_run(folder)
    assert any("runs it on text alone" in note for note in loaded.notes), loaded.notes
    reference = support_matrix._eager("causal_lm", folder, list(result.token_ids))[0]["self"]
    assert support_matrix._worst(result.attention["self"], reference) <= TOLERANCE

    folder = model_dir / "voxtral_realtime"
    config = support_matrix.tiny_config("voxtral_realtime")
    built = transformers.VoxtralRealtimeForConditionalGeneration._from_config(copy.deepcopy(config))
    built.save_pretrained(folder)
    minilm_tokenizer().save_pretrained(folder)
    with pytest.raises(ValueError, match="does not run on text alone") as refused:
        _page_run(folder)
    assert "input_features" not in str(refused.value)


def test_a_folder_whose_weights_are_named_for_another_class_is_refused(model_dir):
    """transformers fills weights it cannot find by name at random; a folder saved from another
    wrapper class would be drawn as noise without a word. The page refuses it and says why."""
    from safetensors.torch import load_file, save_file

    folder = model_dir / "llama"
    support_matrix.build("causal_lm", "llama", folder)
    weights = folder / "model.safetensors"
    save_file({f"wrapper.{name}": tensor for name, tensor in load_file(weights).items()}, weights,
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match="would be random") as refused:
        _page_run(folder)
    assert "wrapper" not in str(refused.value) and "LlamaForCausalLM" in str(refused.value)
