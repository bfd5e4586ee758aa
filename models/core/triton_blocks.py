"""The ``@triton.jit`` pieces every attention-statistics kernel is built of: a block of q or k
loaded with 64-bit offsets, base-2 scores (soft cap, relative bias), the keys a block of query rows
may see and which cells of a block are visible, and one step of the online softmax (running maximum
``m`` and sum ``l`` in base 2, as in Triton's fused-attention tutorial and FlashAttention, Dao et
al. 2022) with the per-row sums the statistics need. Used by the tile kernels
(``models/core/tiles_triton.py``) and corpus mode's fused kernel
(``models/corpus/statistics_triton.py``).
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only PyTorch without Triton: the PyTorch paths serve every device
    triton = None

    class tl:  # noqa: N801 (only so that the kernels' annotations can be read)
        constexpr = None

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _jit(fn):
    return triton.jit(fn) if triton is not None else fn


@_jit
def load_block(BASE, b, head, positions, ok, dims, dim_ok, stride_b, stride_h, stride_n, stride_d,
               UPCAST: tl.constexpr):
    """``(len(positions), BLOCK_D)`` of item ``b``, head ``head`` (0 where not ``ok``). 64-bit
    offsets: rows × stride passes 2³¹ for a large model at 131,072 tokens. ``UPCAST``: to float32
    (the interpreter's numpy has no bfloat16; exact, every bfloat16 is a float32)."""
    block = tl.load(BASE + b.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h
                    + positions.to(tl.int64)[:, None] * stride_n + dims[None, :] * stride_d,
                    mask=ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:
        block = block.to(tl.float32)
    return block


@_jit
def key_range(first_row, last_row, key_start, key_stop, offset, window, CAUSAL: tl.constexpr,
              HAS_WINDOW: tl.constexpr):
    """``[lo, hi)``: the keys some query of ``first_row..last_row`` may see."""
    lo = key_start
    hi = key_stop
    if CAUSAL:
        hi = tl.minimum(hi, last_row + offset + 1)
    if HAS_WINDOW:
        lo = tl.maximum(lo, first_row + offset - window + 1)
    return lo, hi


@_jit
def scores_base2(q, k, scaling, softcap, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """Base-2 scores ``(rows, cols)``: q·k · scaling, soft-capped ``c · tanh(s / c)`` (through
    exp2: finite at both ends)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scaling
    if SOFTCAP:
        s = softcap * (1.0 - 2.0 / (tl.exp2(s * (2.8853900817779268 / softcap)) + 1.0))
    return s * 1.4426950408889634


@_jit
def relative_bias(BIAS, b, head, relative, n_queries, row_ok, col_ok, stride_bb, stride_bh,
                  stride_bn):
    """A bias of ``j − i`` (at index ``j − i + Q − 1``), base 2."""
    bias = tl.load(BIAS + b * stride_bb + head * stride_bh + (relative + n_queries - 1) * stride_bn,
                   mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    return bias.to(tl.float32) * 1.4426950408889634


@_jit
def visible(rows, row_ok, cols, col_ok, key_start, key_stop, offset, window, CAUSAL: tl.constexpr,
            HAS_WINDOW: tl.constexpr):
    """``(seen, relative)``, both ``(rows, cols)``: whether query i sees key j, and ``j − i``."""
    relative = cols[None, :] - rows[:, None]
    seen = row_ok[:, None] & col_ok[None, :]
    seen = seen & (cols[None, :] >= key_start) & (cols[None, :] < key_stop)
    if CAUSAL:
        seen = seen & (relative <= offset)
    if HAS_WINDOW:
        seen = seen & (relative > offset - window)
    return seen, relative


@_jit
def online_step(m_i, l_i, ps_i, pd_i, s, seen, relative, STATISTICS: tl.constexpr):
    """One block of keys into each row's running maximum ``m_i``, sum ``l_i`` and, with
    ``STATISTICS``, ``Σ p·s`` and ``Σ p·|i − j|``, all rescaled when ``m`` grows. ``s``: base-2
    scores. Returns the four, ``p`` (the block's unnormalised weights, 0 where not seen) and
    ``alpha`` (the rescaling), for any further sums."""
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)  # 0 while the row has seen nothing (m_i = −inf)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if STATISTICS:
        ps_i = ps_i * alpha + tl.sum(p * tl.where(seen, s, 0.0), 1)
        distance = tl.where(relative < 0, -relative, relative).to(tl.float32)
        pd_i = pd_i * alpha + tl.sum(p * distance, 1)
    return m_new, l_i, ps_i, pd_i, p, alpha


@_jit
def row_normaliser(m_i, l_i):
    """``(has, safe_l, lse2)``: whether the row saw a key, its sum (1 where not) and its base-2
    log-sum-exp."""
    has = l_i > 0
    safe_l = tl.where(has, l_i, 1.0)
    return has, safe_l, m_i + tl.log2(safe_l)
