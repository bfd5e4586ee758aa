"""Every path that computes per-head statistics equals the float64 reference of
``models/core/head_statistics.py``, and every label shown is the table's.

Paths: the heads table's numpy (``models/analysis/heads.py``), its PyTorch and Triton tile paths
(``models/core/tiles.py``), corpus mode's PyTorch and fused Triton paths
(``models/corpus/statistics.py``). Maps are seeded random q and k, causal and bidirectional, at
lengths below, at and above the kernels' 64-row blocks (70 is no multiple of 64); corpus batches
are right-padded (the second document 7 tokens shorter). The Triton paths run through Triton's
interpreter in a process of their own (``TRITON_INTERPRET=1`` before Triton is imported, as
``tests/test_tiles.py`` explains) and compiled on a GPU when there is one.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from models.analysis import heads
from models.core import head_statistics, tiles
from models.core.head_statistics import CORPUS, HEADS_TABLE, TABLE
from models.corpus import forward, statistics
from models.corpus.readers import Document
from tests.conftest import ROOT

LENGTHS = (5, 40, 70)
CASES = [(length, causal) for length in LENGTHS for causal in (True, False)]
HEADS, KV_HEADS, DIM = 4, 2, 16
VOCAB = 5  # documents repeat tokens: induction targets
PADDING = 7
# float32 q·k and sums against float64: shares to 1e-5; entropy (bits) and distance (tokens, up
# to 70) are sums of 70 terms of their size
TOLERANCE = {"entropy_bits": 1e-4, "mean_distance": 1e-3, "first_token": 1e-5,
             "previous_token": 1e-5, "diagonal": 1e-5, "induction": 1e-5, "max_weight": 1e-5,
             "peak_value": 1e-5}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def qk(length: int, seed: int, batch: int = 1, device: str = "cpu"):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, HEADS, length, DIM, generator=generator) * 2  # some rows peaked
    key = torch.randn(batch, KV_HEADS, length, DIM, generator=generator)
    ids = torch.randint(0, VOCAB, (batch, length), generator=generator)
    return query.to(device), key.to(device), ids.to(device)


def dense(query: torch.Tensor, key: torch.Tensor, causal: bool, length: int) -> np.ndarray:
    """float64 weights ``(heads, n, n)`` of one item's first ``length`` tokens."""
    q = query[0, :, :length].double().cpu()
    k = key[0, :, :length].double().cpu().repeat_interleave(HEADS // KV_HEADS, dim=0)
    logits = q @ k.transpose(-1, -2) * DIM ** -0.5
    if causal:
        future = ~torch.ones(length, length, dtype=torch.bool).tril()
        logits = logits.masked_fill(future, float("-inf"))
    return torch.softmax(logits, -1).numpy()


def assert_close(found: dict, expected: dict, names, path: str) -> None:
    for name in names:
        np.testing.assert_allclose(np.asarray(found[name], np.float64), expected[name], rtol=0,
                                   atol=TOLERANCE.get(name, 0), err_msg=f"{path}: {name}")


# --- the heads table's paths ------------------------------------------------------------------

def tile_statistics(length: int, causal: bool, seed: int, backend: str, device: str = "cpu"):
    query, key, _ = qk(length, seed, device=device)
    scores = tiles.Scores(query, key, DIM ** -0.5, causal=causal)
    found = tiles.head_statistics(scores, backend=backend)
    found = {name: values[0].cpu().numpy() for name, values in found.items()}
    return found, dense(query, key, causal, length)


@pytest.mark.parametrize("length, causal", CASES)
def test_the_numpy_path_equals_the_reference(length, causal):
    query, key, _ = qk(length, seed=length)
    weights = dense(query, key, causal, length)
    expected = head_statistics.reference(weights)
    found = heads.layer_statistics(weights.astype(np.float32))
    assert set(found) == set(HEADS_TABLE)
    assert_close(found, expected, HEADS_TABLE, "numpy")


@pytest.mark.parametrize("length, causal", CASES)
def test_the_pytorch_tile_path_equals_the_reference(length, causal):
    found, weights = tile_statistics(length, causal, seed=length, backend="torch")
    assert set(found) == set(HEADS_TABLE)
    assert_close(found, head_statistics.reference(weights), HEADS_TABLE, "tiles, torch")


# --- corpus mode's paths ----------------------------------------------------------------------

def corpus_statistics(length: int, causal: bool, seed: int, device: str = "cpu"):
    """``HeadStatistics`` over a right-padded batch of two documents (``length`` and ``length − 7``
    tokens, at least 1): ``(found, expected)`` per document, ``{name: (heads,)}``."""
    lengths = [length, max(1, length - PADDING)]
    query, key, ids = qk(length, seed, batch=2, device=device)
    stops = torch.tensor(lengths, device=device)
    valid = torch.arange(length, device=device)[None, :] < stops[:, None]
    allowed = valid[:, None, :].expand(2, length, length)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=device).tril()
    documents = [Document(f"doc#{i}", "") for i in range(2)]
    token_ids = [ids[i, :n].tolist() for i, n in enumerate(lengths)]
    batch = forward.Batch(documents, token_ids, ids, valid.long(), stops)
    mask = forward._mask(None, allowed[:, None], {}, length, length, device, tile_rows=32)
    reduction = statistics.HeadStatistics(layers=1)
    reduction.start(batch)
    reduction.layer(forward.LayerCall(0, query, key, DIM ** -0.5, mask, None))
    reduction.finish()
    out = []
    for item, n in enumerate(lengths):
        found = {name: reduction.values[item, 0, :, index]
                 for index, name in enumerate(statistics.FIELDS)}
        weights = dense(query[item:item + 1], key[item:item + 1], causal, n)
        expected = head_statistics.reference(weights, token_ids=token_ids[item], causal=causal)
        out.append((found, expected))
    return out


def check_corpus(length: int, causal: bool, path: str, device: str = "cpu") -> None:
    for found, expected in corpus_statistics(length, causal, seed=length, device=device):
        assert_close(found, expected, (*CORPUS, "peak_value"), path)
        has_peak = ~np.isnan(expected["peak_value"])
        for name in ("peak_query", "peak_key"):  # random maps: no ties
            np.testing.assert_array_equal(found[name][has_peak], expected[name][has_peak],
                                          err_msg=f"{path}: {name}")


@pytest.mark.parametrize("length, causal", CASES)
def test_the_corpus_pytorch_path_equals_the_reference(length, causal, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_CORPUS_KERNEL", "torch")
    check_corpus(length, causal, "corpus, torch")


def test_the_eager_baseline_is_the_reference():
    """``eager_statistics`` (the corpus benches' and tests' baseline) is ``reference``."""
    import inspect

    assert "head_statistics.reference" in inspect.getsource(statistics.eager_statistics)


# --- the Triton paths -------------------------------------------------------------------------

def check_triton(device: str = "cpu") -> int:
    checked = 0
    for length, causal in CASES:
        found, weights = tile_statistics(length, causal, length, backend="triton", device=device)
        assert_close(found, head_statistics.reference(weights), HEADS_TABLE, "tiles, triton")
        check_corpus(length, causal, "corpus, triton", device=device)
        checked += 1
    return checked


def test_the_triton_paths_equal_the_reference_in_the_interpreter():
    done = subprocess.run([sys.executable, "-m", "tests.test_head_statistics"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert done.stdout.strip().splitlines()[-1] == f"{len(CASES)} cases equal the reference"


@needs_cuda
@pytest.mark.cuda
def test_the_compiled_triton_paths_equal_the_reference_on_the_gpu():
    assert check_triton("cuda") == len(CASES)


# --- one table of names and labels ------------------------------------------------------------

def test_every_path_names_its_statistics_from_the_table():
    labels = {statistic.name: statistic.label for statistic in TABLE}
    assert heads.STATISTICS == {name: labels[name] for name in HEADS_TABLE}
    assert statistics.STATISTICS == {name: labels[name] for name in CORPUS}
    assert tiles.HEAD_STATISTICS == HEADS_TABLE
    assert statistics.FIELDS == (*CORPUS, *head_statistics.PEAK_FIELDS)
    assert all(statistic.unit and statistic.formula for statistic in TABLE)


def test_the_heads_table_and_the_corpus_figure_show_the_tables_labels():
    from models.corpus.analysis import CorpusSummary
    from models.corpus.store import RunInfo
    from viz.figures.corpus import statistic_map

    weights = dense(*qk(12, seed=1)[:2], causal=True, length=12)
    layer = heads.layer_statistics(weights)
    summary = heads.HeadSummary(np.zeros((1, HEADS, 4, 4), np.float32),
                                {name: values[None] for name, values in layer.items()})
    table = heads.summary_table(summary)
    shown = [head_statistics.label(name) for name in HEADS_TABLE]
    assert list(table.columns) == ["layer", "head", *shown]
    assert all(summary.label(name) == head_statistics.label(name) for name in HEADS_TABLE)
    fields = {name: np.ones((1, HEADS), np.float32) for name in CORPUS}
    corpus = CorpusSummary(RunInfo("tiny", "docs", 64, 1, HEADS), 2, 10, [], fields, fields)
    for name in CORPUS:
        assert statistic_map(corpus, name).caption.startswith(head_statistics.label(name) + ":")


OLD_LABELS = ("Share on first token",)


def test_no_label_is_written_outside_the_table():
    """A statistic's label, or a label it had before the table, appears in no other source file."""
    said = [statistic.label for statistic in TABLE] + list(OLD_LABELS)
    offenders = []
    for folder in ("models", "viz", "app", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "models" / "core" / "head_statistics.py":
                continue
            text = path.read_text()
            offenders += [f"{path.relative_to(ROOT)}: {label!r}" for label in said
                          if re.search(rf"[\"']{re.escape(label)}[\"']", text)]
    assert not offenders, offenders


if __name__ == "__main__":  # the interpreter's cases, run by the test above in its own process
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(f"{check_triton()} cases equal the reference")
