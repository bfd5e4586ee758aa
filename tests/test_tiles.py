"""The reduction engine (models/core/tiles.py) equals a float64 dense reference, through both backends: the chunked
PyTorch path, and the Triton kernels run by Triton's interpreter on CPU tensors (on the GPU when there is one).

The grid covers what the families give it: causal and not, a padded batch (each item its own range of real keys,
some queries seeing nothing), grouped-query attention, a T5-style relative bias, a sliding window, an offset
causal mask, bfloat16/float16/float32 q and k, tiles that do not divide the window, and the head average.
"""
from __future__ import annotations

import math

import pytest
import torch

from models.core import head_statistics, tiles

LN2 = math.log(2.0)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def case(batch=2, heads=4, kv_heads=2, queries=40, keys=40, d=16, causal=True, padded=True, bias=True, window=0,
         offset=0, dtype=torch.float32, device="cpu", seed=0, softcap=0.0, sink=False) -> tiles.Scores:
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, queries, d, generator=generator).to(device, dtype)
    key = torch.randn(batch, kv_heads, keys, d, generator=generator).to(device, dtype)
    relative = torch.randn(1, heads, queries + keys - 1, generator=generator).to(device) if bias else None
    starts = tuple(3 * b for b in range(batch)) if padded else ()  # left padding: item b's first 3b keys
    stops = tuple(keys - 5 * b for b in range(batch)) if padded else ()  # right padding: its last 5b keys
    # sinks from −2 to 2: some rows give most of themselves to the sink, some little
    sinks = torch.linspace(-2, 2, heads).to(device) if sink else None
    return tiles.Scores(query, key, d ** -0.5 * (4 if softcap else 1), causal=causal, offset=offset, window=window,
                        key_start=starts, key_stop=stops, relative_bias=relative, softcap=softcap, sink=sinks)


def reduce_reference(weights: torch.Tensor, seen: torch.Tensor, query_edges, key_edges):
    """float64 (maximum, sum, visible count) per tile of ``weights (B, h, Q, K)`` (dense, on the CPU)."""
    rows, cols = torch.tensor(query_edges), torch.tensor(key_edges)
    out_max, out_sum, out_seen = [], [], []
    for a in range(len(rows) - 1):
        line_max, line_sum, line_seen = [], [], []
        for b in range(len(cols) - 1):
            block = weights[..., rows[a]:rows[a + 1], cols[b]:cols[b + 1]]
            line_max.append(block.amax((-1, -2)))
            line_sum.append(block.sum((-1, -2)))
            line_seen.append(seen[..., rows[a]:rows[a + 1], cols[b]:cols[b + 1]].sum((-1, -2)).double())
        out_max.append(torch.stack(line_max, -1))
        out_sum.append(torch.stack(line_sum, -1))
        out_seen.append(torch.stack(line_seen, -1))
    return torch.stack(out_max, -2), torch.stack(out_sum, -2), torch.stack(out_seen, -2)


TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-5, torch.bfloat16: 2e-5}  # q/k rounded, products in fp32


def check_backend(scores: tiles.Scores, backend: str, query_edges, key_edges, heads=(0, 1, 3)) -> None:
    heads = tuple(h for h in heads if h < scores.heads)
    reference = tiles.reference(scores)  # (B, H, Q, K) float64
    seen = scores.visible(torch.arange(scores.queries, device=scores.device),
                          torch.arange(scores.keys, device=scores.device)).cpu()[:, None]
    chosen = reference[:, list(heads)]
    atol = TOLERANCE[scores.query.dtype]

    passed = tiles.row_pass(scores, heads, statistics=True, backend=backend)
    torch.testing.assert_close(passed.row_max.cpu().double(), chosen.amax(-1), atol=atol, rtol=0)
    entropy = -torch.special.xlogy(chosen, chosen).sum(-1) / LN2
    if scores.sink is not None:  # the sink is one more outcome of each row's distribution
        sink_share = (1 - chosen.sum(-1)).clamp_min(0)
        entropy = entropy - torch.special.xlogy(sink_share, sink_share) / LN2
        found = tiles.sink_shares(scores, heads, backend=backend)
        torch.testing.assert_close(found.cpu().double(), sink_share, atol=atol, rtol=0)
    torch.testing.assert_close(passed.entropy_bits.cpu().double(), entropy, atol=50 * atol, rtol=1e-5)
    gap = (torch.arange(scores.keys)[None, :] - torch.arange(scores.queries)[:, None]).abs().double()
    torch.testing.assert_close(passed.distance.cpu().double(), (chosen * gap).sum(-1), atol=500 * atol, rtol=1e-5)
    sees_nothing = ~seen[:, 0].any(-1)  # (B, Q)
    if scores.sink is None:  # with a sink, such a row gives all of itself to the sink
        assert torch.isinf(passed.normaliser.cpu()[sees_nothing[:, None].expand_as(passed.normaliser)]).all()

    single = tiles.tile_pass(scores, heads, query_edges, key_edges, normalisers=passed, backend=backend)
    window = (slice(query_edges[0], query_edges[-1]), slice(key_edges[0], key_edges[-1]))
    shift_q, shift_k = [e - query_edges[0] for e in query_edges], [e - key_edges[0] for e in key_edges]
    maximum, total, count = reduce_reference(chosen[..., window[0], window[1]],
                                             seen[..., window[0], window[1]].expand(-1, len(heads), -1, -1),
                                             shift_q, shift_k)
    torch.testing.assert_close(single.maximum.cpu().double(), maximum, atol=atol, rtol=0)
    torch.testing.assert_close(single.total.cpu().double(), total, atol=20 * atol, rtol=0)
    torch.testing.assert_close(single.visible.cpu().double(), count, atol=0, rtol=0)
    torch.testing.assert_close(single.row_max.cpu().double(), chosen[..., window[0], window[1]].amax(-1),
                               atol=atol, rtol=0)

    mean = tiles.tile_pass(scores, list(range(scores.heads)), query_edges, key_edges, average=True, backend=backend)
    averaged = reference.mean(1, keepdim=True)[..., window[0], window[1]]
    maximum, total, _ = reduce_reference(averaged, seen[..., window[0], window[1]], shift_q, shift_k)
    torch.testing.assert_close(mean.maximum.cpu().double(), maximum, atol=atol, rtol=0)
    torch.testing.assert_close(mean.total.cpu().double(), total, atol=20 * atol, rtol=0)

    statistics = tiles.head_statistics(scores, heads, backend=backend)
    for item in range(scores.batch):  # models/core/head_statistics.py's reference, item by item
        expected = head_statistics.reference(chosen[item].numpy(), sink=scores.sink is not None)
        for name in head_statistics.HEADS_TABLE:
            torch.testing.assert_close(statistics[name][item].cpu().double(),
                                       torch.from_numpy(expected[name]), atol=500 * atol, rtol=1e-5)


GRID = [  # (case keyword arguments, query edges, key edges)
    ({}, tiles.uniform_edges(0, 40, 8), tiles.uniform_edges(0, 40, 8)),
    ({"causal": False, "bias": False}, [0, 7, 19, 40], [0, 1, 2, 30, 40]),  # uneven tiles, single cells
    ({"padded": False, "kv_heads": 1, "queries": 24, "keys": 56, "offset": 32}, tiles.uniform_edges(3, 24, 5),
     tiles.uniform_edges(10, 56, 16)),  # a causal mask offset as with cached keys; a window of the map
    ({"window": 6, "bias": False}, tiles.uniform_edges(0, 40, 16), tiles.uniform_edges(0, 40, 16)),
    ({"dtype": torch.bfloat16}, tiles.uniform_edges(0, 40, 16), tiles.uniform_edges(0, 40, 4)),
    ({"dtype": torch.float16, "heads": 2, "kv_heads": 2, "d": 20}, tiles.uniform_edges(0, 40, 32),
     tiles.uniform_edges(0, 40, 32)),  # a head dimension that is no power of two
    ({"batch": 1, "heads": 2, "kv_heads": 1, "queries": 150, "keys": 150, "bias": False, "padded": False},
     [0, 130, 150], tiles.uniform_edges(0, 150, 50)),  # a query tile of several row blocks: the kernel splits its rows
    # Gemma 2's soft-capped scores (a scale large enough that the cap bends them) and gpt-oss's sinks, with a
    # sliding window and padding (rows that see nothing give all of themselves to the sink)
    ({"softcap": 2.0, "window": 6}, tiles.uniform_edges(0, 40, 8), tiles.uniform_edges(0, 40, 8)),
    ({"sink": True, "window": 5, "bias": False}, tiles.uniform_edges(0, 40, 8), tiles.uniform_edges(0, 40, 8)),
    ({"sink": True, "softcap": 3.0, "dtype": torch.bfloat16, "causal": False}, tiles.uniform_edges(0, 40, 16),
     tiles.uniform_edges(0, 40, 10)),
]


@pytest.mark.parametrize("arguments, query_edges, key_edges", GRID)
def test_the_pytorch_path_equals_the_float64_reference(arguments, query_edges, key_edges):
    check_backend(case(**arguments), "torch", query_edges, key_edges)


INTERPRETED = GRID[:1] + GRID[2:5] + GRID[6:]  # the interpreter runs a program at a time in Python: a few cases, small


def test_the_triton_kernels_equal_the_float64_reference_in_the_interpreter():
    """CPU tensors through Triton's interpreter: the kernels' own logic (masks, online softmax, tiles), in a fresh
    process with ``TRITON_INTERPRET=1`` set before Triton is imported (its library of reductions is interpreted only
    then; a process that imported Triton before, as the rest of the suite may, cannot run the interpreter)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run([sys.executable, "-m", "tests.test_tiles"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert done.stdout.strip().splitlines()[-1] == f"{len(INTERPRETED)} cases equal the reference"


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("arguments, query_edges, key_edges", GRID)
def test_the_compiled_kernels_equal_the_reference_on_the_gpu(arguments, query_edges, key_edges):
    check_backend(case(**arguments, device="cuda"), "triton", query_edges, key_edges)
    check_backend(case(**arguments, device="cuda"), "torch", query_edges, key_edges)


def test_a_mask_and_a_bias_given_whole_go_through_the_pytorch_path():
    """A mask no rule describes (every other key hidden) and a bias that is no function of j − i."""
    scores = case(padded=False, bias=False)
    allowed = torch.ones(1, 40, 40, dtype=torch.bool)
    allowed[..., 1::2] = False
    allowed[:, 5] = False  # a query that sees nothing
    dense = tiles.Scores(scores.query, scores.key, scores.scaling, causal=True, allowed=allowed,
                         bias=torch.randn(1, 4, 40, 40))
    check_backend(dense, "torch", tiles.uniform_edges(0, 40, 8), tiles.uniform_edges(0, 40, 8))
    with pytest.raises(ValueError, match="described masks"):
        tiles.row_pass(dense, [0], backend="triton")


def test_cells_and_pointwise_weights_are_the_exact_ones():
    scores = case()
    reference = tiles.reference(scores)
    window = tiles.cells(scores, [2], (5, 17), (0, 40))
    torch.testing.assert_close(window[:, 0].double(), reference[:, 2, 5:17], atol=2e-6, rtol=0)
    mean = tiles.cells(scores, [0, 1, 2, 3], (39, 40), (10, 30), average=True)
    torch.testing.assert_close(mean[:, 0].double(), reference[:, :, 39:40, 10:30].mean(1), atol=2e-6, rtol=0)
    passed = tiles.row_pass(scores, [1])
    rows = torch.arange(40)
    torch.testing.assert_close(tiles.pointwise(scores, 1, rows, rows, passed.normaliser[:, 0]).double(),
                               reference[:, 1, rows, rows], atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="outside"):
        tiles.cells(scores, [0], (0, 41), (0, 4))


def test_a_chunk_holds_rows_not_the_map(monkeypatch):
    """Rows are processed a bounded chunk at a time: with a budget of a few rows the numbers do not change."""
    scores = case(queries=40, keys=40)
    expected = tiles.tile_pass(scores, [0], tiles.uniform_edges(0, 40, 8), tiles.uniform_edges(0, 40, 8))
    monkeypatch.setitem(tiles.CHUNK_BYTES, "cpu", 3 * 2 * 40 * tiles.BYTES_PER_CELL)  # three rows a chunk
    assert tiles._rows_per_chunk(scores, 40) == 3
    found = tiles.tile_pass(scores, [0], tiles.uniform_edges(0, 40, 8), tiles.uniform_edges(0, 40, 8))
    torch.testing.assert_close(found.maximum, expected.maximum)
    torch.testing.assert_close(found.total, expected.total, atol=1e-6, rtol=0)


def test_pyramid_levels_are_powers_of_two_that_fit():
    assert tiles.pyramid_tile(131_072, 900) == 256 and 131_072 / 256 <= 900
    assert tiles.pyramid_tile(900, 900) == 1 and tiles.pyramid_tile(901, 900) == 2
    assert tiles.pyramid_tile(8192, 640) == 16
    assert tiles.uniform_edges(5, 20, 8) == [5, 13, 20]


if __name__ == "__main__":  # the interpreter's cases, run by the test above in a process of their own
    import os

    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    for arguments, query_edges, key_edges in INTERPRETED:
        check_backend(case(**arguments), "triton", query_edges, key_edges)
    print(f"{len(INTERPRETED)} cases equal the reference")
