"""The tile reduction of ``models/core/tiles.py`` as two fused Triton kernels, for CUDA.

- ``row_kernel``: one program per block of ``BLOCK_M`` query rows of one head; it walks the keys those rows may see
  ``BLOCK_N`` at a time with an online softmax (running maximum ``m`` and sum ``l``, base 2 as in Triton's fused
  attention tutorial) and writes each row's log-sum-exp, and optionally ``Σ p·s`` and ``Σ p·|i − j|`` for its
  entropy and mean distance. Masked keys are never loaded past the causal edge or outside the item's key range.
- ``tile_kernel``: programs over query tiles × row blocks of a tile × key tiles (``_splits``: enough of them that
  a causal map's heavy last rows do not run alone at the end); for each block of its rows and each of its key tiles
  a program recomputes ``p = exp(s − L)`` block by block with the normalisers of the first kernel, and adds the
  tile's maximum, sum and visible count, and each row's maximum, into the outputs atomically. A tile that no row of
  the block can see is skipped, so a causal head costs half its tiles.

Both kernels take the mask as rules (causal + offset, a sliding window, each item's key range), a bias only as a
function of ``j − i`` (``relative_bias``), the scores' soft cap and each head's sink logit (the row kernel adds it to
the denominator; the tile kernel reads the normalisers it wrote); anything given whole goes to the PyTorch path. Block sizes are
``constexpr``; ``tests/test_tiles.py`` runs both kernels through Triton's interpreter (CPU tensors) against the
float64 reference over a grid of shapes, and on the GPU when there is one.
"""
from __future__ import annotations

import functools

import torch

from models.core.scores import RowPass, Scores, TilePass
from models.core.triton_blocks import (  # noqa: F401  (tl, triton, LOG2E, LN2: public here too)
    LN2,
    LOG2E,
    key_range,
    load_block,
    online_step,
    relative_bias,
    row_normaliser,
    scores_base2,
    tl,
    triton,
    visible,
)


def available(device: torch.device) -> bool:
    """Whether the kernels can run on ``device``: Triton present, and a CUDA device (or the interpreter on CPU)."""
    if triton is None:
        return False
    return device.type == "cuda" or (device.type == "cpu" and _interpreting())


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def _row_kernel(Q, K, BIAS, SINK, KEY_START, KEY_STOP, HEADS, LSE, ROW_MAX, PS, PD,
                stride_qb, stride_qh, stride_qm, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_bb, stride_bh, stride_bn,
                stride_ob, stride_oh,
                n_queries, head_dim, n_outputs, group, row_start, row_stop, scaling, softcap, offset, window,
                CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_BIAS: tl.constexpr, STATISTICS: tl.constexpr,
                SOFTCAP: tl.constexpr, HAS_SINK: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    block = tl.num_programs(0) - 1 - tl.program_id(0)  # the last rows first: a causal map's see the most keys
    b = tl.program_id(1) // n_outputs
    slot = tl.program_id(1) % n_outputs
    head = tl.load(HEADS + slot)
    kv_head = head // group
    first_row = row_start + block * BLOCK_M
    rows = first_row + tl.arange(0, BLOCK_M)
    row_ok = rows < row_stop
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q = load_block(Q, b, head, rows, row_ok, dims, dim_ok, stride_qb, stride_qh, stride_qm,
                   stride_qd, UPCAST)
    key_start = tl.load(KEY_START + b)
    key_stop = tl.load(KEY_STOP + b)
    last_row = tl.minimum(first_row + BLOCK_M, row_stop) - 1
    lo, hi = key_range(first_row, last_row, key_start, key_stop, offset, window, CAUSAL, HAS_WINDOW)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    ps_i = tl.zeros([BLOCK_M], tl.float32)
    pd_i = tl.zeros([BLOCK_M], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        k = load_block(K, b, kv_head, cols, col_ok, dims, dim_ok, stride_kb, stride_kh, stride_kn,
                       stride_kd, UPCAST)
        s = scores_base2(q, k, scaling, softcap, SOFTCAP, PRECISION)
        seen, relative = visible(rows, row_ok, cols, col_ok, key_start, key_stop, offset, window,
                                 CAUSAL, HAS_WINDOW)
        if HAS_BIAS:
            s += relative_bias(BIAS, b, head, relative, n_queries, row_ok, col_ok, stride_bb,
                               stride_bh, stride_bn)
        m_i, l_i, ps_i, pd_i, _, _ = online_step(m_i, l_i, ps_i, pd_i, s, seen, relative,
                                                 STATISTICS)
    top_key = m_i  # the row's largest key score (base 2), before the sink joins
    if HAS_SINK:  # one more term of the denominator, with no key and no distance
        sink = tl.load(SINK + head).to(tl.float32) * 1.4426950408889634
        m_new = tl.maximum(m_i, sink)
        alpha = tl.exp2(m_i - m_new)
        beta = tl.exp2(sink - m_new)
        l_i = l_i * alpha + beta
        ps_i = ps_i * alpha + beta * sink
        pd_i = pd_i * alpha
        m_i = m_new
    has, safe_l, lse2 = row_normaliser(m_i, l_i)
    out = b * stride_ob + slot * stride_oh + (rows - row_start)
    tl.store(LSE + out, tl.where(has, lse2 * 0.6931471805599453, float("-inf")), mask=row_ok)
    top = tl.where(top_key == float("-inf"), 0.0, tl.exp2(top_key - tl.where(has, lse2, 0.0)))
    tl.store(ROW_MAX + out, tl.where(has, top, 0.0), mask=row_ok)  # p of the row's top key
    if STATISTICS:
        tl.store(PS + out, tl.where(has, lse2 - ps_i / safe_l, 0.0), mask=row_ok)  # entropy, bits
        tl.store(PD + out, tl.where(has, pd_i / safe_l, 0.0), mask=row_ok)


def _tile_kernel(Q, K, BIAS, KEY_START, KEY_STOP, HEADS, LSE, QUERY_EDGES, KEY_EDGES,
                 OUT_MAX, OUT_SUM, OUT_SEEN, ROW_MAX,
                 stride_qb, stride_qh, stride_qm, stride_qd,
                 stride_kb, stride_kh, stride_kn, stride_kd,
                 stride_bb, stride_bh, stride_bn,
                 stride_lb, stride_lh,
                 stride_ob, stride_og, stride_oq,
                 stride_rb, stride_rg,
                 n_queries, head_dim, n_outputs, per_output, n_key_tiles, group, lse_start, window_start,
                 scaling, softcap, offset, window, rows_per_split, tiles_per_split, n_key_splits,
                 CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr):
    tile_q = tl.program_id(0)
    row_split = tl.program_id(1)
    b = tl.program_id(2) // (n_outputs * n_key_splits)
    slot = (tl.program_id(2) // n_key_splits) % n_outputs
    key_split = tl.program_id(2) % n_key_splits
    r0 = tl.load(QUERY_EDGES + tile_q)
    r1 = tl.load(QUERY_EDGES + tile_q + 1)
    own_first = r0 + row_split * rows_per_split  # this program's rows of the tile, and its share of the key tiles
    own_stop = tl.minimum(r1, own_first + rows_per_split)
    first_tile = key_split * tiles_per_split
    stop_tile = tl.minimum(n_key_tiles, first_tile + tiles_per_split)
    key_start = tl.load(KEY_START + b)
    key_stop = tl.load(KEY_STOP + b)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    for first_row in range(own_first, own_stop, BLOCK_M):
        rows = first_row + tl.arange(0, BLOCK_M)
        row_ok = rows < own_stop
        last_row = tl.minimum(first_row + BLOCK_M, own_stop) - 1
        lo, hi = key_range(first_row, last_row, key_start, key_stop, offset, window, CAUSAL,
                           HAS_WINDOW)
        row_top = tl.zeros([BLOCK_M], tl.float32)
        for tile_k in range(first_tile, stop_tile):
            c0 = tl.maximum(tl.load(KEY_EDGES + tile_k), lo)
            c1 = tl.minimum(tl.load(KEY_EDGES + tile_k + 1), hi)
            if c0 < c1:  # some row of this block may see some key of this tile
                top = tl.zeros([BLOCK_M], tl.float32)
                total = tl.zeros([BLOCK_M], tl.float32)
                seen_count = tl.zeros([BLOCK_M], tl.float32)
                for start in range(c0, c1, BLOCK_N):
                    cols = start + tl.arange(0, BLOCK_N)
                    col_ok = cols < c1
                    seen, relative = visible(rows, row_ok, cols, col_ok, key_start, key_stop,
                                             offset, window, CAUSAL, HAS_WINDOW)
                    summed = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                    for member in range(0, per_output):
                        index = slot * per_output + member
                        head = tl.load(HEADS + index)
                        q = load_block(Q, b, head, rows, row_ok, dims, dim_ok, stride_qb,
                                       stride_qh, stride_qm, stride_qd, UPCAST)
                        k = load_block(K, b, head // group, cols, col_ok, dims, dim_ok,
                                       stride_kb, stride_kh, stride_kn, stride_kd, UPCAST)
                        s = scores_base2(q, k, scaling, softcap, SOFTCAP, PRECISION)
                        if HAS_BIAS:
                            s += relative_bias(BIAS, b, head, relative, n_queries, row_ok,
                                               col_ok, stride_bb, stride_bh, stride_bn)
                        lse2 = tl.load(LSE + b * stride_lb + index * stride_lh + (rows - lse_start), mask=row_ok,
                                       other=0.0) * 1.4426950408889634
                        lse2 = tl.where(lse2 == float("-inf"), 0.0, lse2)  # a row that sees nothing: masked below
                        summed += tl.where(seen, tl.exp2(s - lse2[:, None]), 0.0)
                    summed = summed / per_output
                    top = tl.maximum(top, tl.max(summed, 1))
                    total += tl.sum(summed, 1)
                    seen_count += tl.sum(seen.to(tl.float32), 1)
                row_top = tl.maximum(row_top, top)
                # other programs hold the tile's other rows and keys: the outputs are combined atomically
                # (weights are ≥ 0, so a float maximum over zero-initialised outputs is exact)
                out = b * stride_ob + slot * stride_og + tile_q * stride_oq + tile_k
                tl.atomic_max(OUT_MAX + out, tl.max(top, 0))
                tl.atomic_add(OUT_SUM + out, tl.sum(total, 0))
                tl.atomic_add(OUT_SEEN + out, tl.sum(seen_count, 0))
        tl.atomic_max(ROW_MAX + b * stride_rb + slot * stride_rg + (rows - window_start), row_top, mask=row_ok)


@functools.lru_cache(maxsize=2)
def kernels(interpret: bool) -> tuple:
    """(row kernel, tile kernel) compiled by Triton's JIT, or run by its interpreter on CPU tensors (tests)."""
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(_row_kernel), InterpretedFunction(_tile_kernel)
    return triton.jit(_row_kernel), triton.jit(_tile_kernel)


def _blocks(scores: Scores) -> dict:
    head_dim = scores.query.shape[-1]
    # Triton's interpreter multiplies bfloat16 blocks wrongly (numpy has no bfloat16): there the blocks are cast to
    # float32 first (exact: every bfloat16 is a float32), and the products are the same as the GPU's, which
    # accumulates bfloat16 products in float32
    upcast = scores.device.type == "cpu" and scores.query.dtype == torch.bfloat16
    precision = "ieee" if scores.query.dtype == torch.float32 or upcast else "tf32"  # fp32 q/k: exact, no TF32
    return {"BLOCK_D": max(16, triton.next_power_of_2(head_dim)), "PRECISION": precision, "UPCAST": upcast}


def _common(scores: Scores) -> tuple:
    """Arguments both kernels share: key ranges, the bias and its strides, the head ids."""
    device = scores.device
    key_start = torch.tensor(scores.starts(), dtype=torch.int32, device=device)
    key_stop = torch.tensor(scores.stops(), dtype=torch.int32, device=device)
    bias = scores.relative_bias
    if bias is None:
        bias_args = (torch.zeros(1, device=device), 0, 0, 0)
    else:
        bias_args = (bias, bias.stride(0) if bias.shape[0] > 1 else 0, bias.stride(1) if bias.shape[1] > 1 else 0,
                     bias.stride(2))
    return key_start, key_stop, bias_args


PROGRAMS = 8192  # programs the tile kernel is split into at least, where the window allows: a GPU runs ~1,000 at once,
# and with one program per query tile a causal overview's last tile (every key before it) ran alone at the end


def _splits(query_tiles: int, key_tiles: int, outputs: int, row_blocks: int) -> tuple[int, int]:
    """(row splits, key splits) of the tile kernel's grid: one program per query tile and output does every row
    block of its tile over every key tile, which at 131,072 tokens left 512 programs of very unequal work (a
    causal map's last row of tiles sees every key). Split the rows of a tile first, then its keys, until there
    are about ``PROGRAMS`` programs."""
    programs = max(1, query_tiles * outputs)
    row_splits = max(1, min(row_blocks, -(-PROGRAMS // programs)))
    key_splits = max(1, min(key_tiles, -(-PROGRAMS // (programs * row_splits))))
    return row_splits, key_splits


def _check_dtypes(scores: Scores) -> None:
    if scores.query.dtype != scores.key.dtype:
        raise ValueError(f"query ({scores.query.dtype}) and key ({scores.key.dtype}) must share a dtype")


def row_pass(scores: Scores, heads: list[int], rows: tuple[int, int], statistics: bool) -> RowPass:
    _check_dtypes(scores)
    device = scores.device
    row_kernel, _ = kernels(device.type == "cpu")
    key_start, key_stop, (bias, sbb, sbh, sbn) = _common(scores)
    head_ids = torch.tensor(heads, dtype=torch.int32, device=device)
    shape = (scores.batch, len(heads), rows[1] - rows[0])
    normaliser = torch.empty(shape, device=device)
    row_max = torch.empty(shape, device=device)
    entropy = torch.empty(shape, device=device) if statistics else normaliser
    distance = torch.empty(shape, device=device) if statistics else normaliser
    q, k = scores.query, scores.key
    block_m, block_n = 64, 64
    grid = (triton.cdiv(shape[2], block_m), scores.batch * len(heads))
    sink = scores.sink.to(device, torch.float32) if scores.sink is not None else torch.zeros(1, device=device)
    row_kernel[grid](
        q, k, bias, sink, key_start, key_stop, head_ids, normaliser, row_max, entropy, distance,
        *q.stride(), *k.stride(), sbb, sbh, sbn, normaliser.stride(0), normaliser.stride(1),
        scores.queries, q.shape[-1], len(heads), scores.group, rows[0], rows[1], scores.scaling,
        float(scores.softcap or 1.0), scores.offset, scores.window,
        CAUSAL=scores.causal, HAS_WINDOW=scores.window > 0, HAS_BIAS=scores.relative_bias is not None,
        STATISTICS=statistics, SOFTCAP=bool(scores.softcap), HAS_SINK=scores.sink is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, **_blocks(scores))
    return RowPass(rows, normaliser, row_max, entropy if statistics else None, distance if statistics else None)


def tile_pass(scores: Scores, heads: list[int], query_edges: torch.Tensor, key_edges: torch.Tensor, average: bool,
              normalisers: RowPass) -> TilePass:
    _check_dtypes(scores)
    device = scores.device
    _, tile_kernel = kernels(device.type == "cpu")
    key_start, key_stop, (bias, sbb, sbh, sbn) = _common(scores)
    outputs, per_output = (1, len(heads)) if average else (len(heads), 1)
    head_ids = torch.tensor(heads, dtype=torch.int32, device=device)
    tq, tk = len(query_edges) - 1, len(key_edges) - 1
    maximum = torch.zeros(scores.batch, outputs, tq, tk, device=device)
    total = torch.zeros_like(maximum)
    seen = torch.zeros_like(maximum)
    window_start = int(query_edges[0])
    row_max = torch.zeros(scores.batch, outputs, int(query_edges[-1]) - window_start, device=device)
    lse = normalisers.normaliser  # (B, len(heads), R) in the order of ``heads``
    widest_q = int(torch.diff(query_edges).max())
    widest_k = int(torch.diff(key_edges).max())
    block_m = min(64, max(16, triton.next_power_of_2(widest_q)))  # small tiles (deep zoom levels): small blocks
    block_n = min(64, max(16, triton.next_power_of_2(widest_k)))
    row_splits, key_splits = _splits(tq, tk, scores.batch * outputs, triton.cdiv(widest_q, block_m))
    rows_per_split = triton.cdiv(triton.cdiv(widest_q, block_m), row_splits) * block_m
    tiles_per_split = triton.cdiv(tk, key_splits)
    q, k = scores.query, scores.key
    tile_kernel[(tq, row_splits, scores.batch * outputs * key_splits)](
        q, k, bias, key_start, key_stop, head_ids, lse, query_edges.to(device, torch.int32),
        key_edges.to(device, torch.int32), maximum, total, seen, row_max,
        *q.stride(), *k.stride(), sbb, sbh, sbn, lse.stride(0), lse.stride(1),
        maximum.stride(0), maximum.stride(1), maximum.stride(2), row_max.stride(0), row_max.stride(1),
        scores.queries, q.shape[-1], outputs, per_output, tk, scores.group, normalisers.rows[0], window_start,
        scores.scaling, float(scores.softcap or 1.0), scores.offset, scores.window, rows_per_split,
        tiles_per_split, key_splits,
        CAUSAL=scores.causal, HAS_WINDOW=scores.window > 0, HAS_BIAS=scores.relative_bias is not None,
        SOFTCAP=bool(scores.softcap), BLOCK_M=block_m, BLOCK_N=block_n, **_blocks(scores))
    return TilePass(query_edges, key_edges, maximum, total, seen, row_max)
