"""Every per-head statistic of one self-attention layer of a padded batch in one fused Triton kernel: the corpus
statistics of ``models/corpus/statistics.py`` (``HeadStatistics``) read from q and k, without the ``(B, H, q, k)``
weights. On a GPU the PyTorch path's ~40 small operations per layer cost 2.5× the forward they read (one H200,
SmolLM2's shape: 15,600 tokens/s against the bare forward's 38,600); one launch per layer costs about what the
forward's attention does.

A program takes one document, one head and ``BLOCK_M`` query rows, and walks the keys those rows see ``BLOCK_N`` at a
time with an online softmax (running maximum ``m`` and sum ``l`` in base 2, the forward of FlashAttention, Dao et al.
2022). As it goes it keeps, rescaled whenever ``m`` grows, ``Σ p·s`` (the entropy: ``Σ p ln p = Σ p·s − L``),
``Σ p·|i − j|`` (the mean distance) and ``Σ p`` over the induction targets (keys whose previous token is the query's
token, Olsson et al. 2022); unscaled, the scores of the three cells it reads (the first key, the diagonal, the
previous position) and the largest score off the first key and the diagonal with its key (the peak). The row's
normaliser ``L = m + log₂ l`` then turns each into weights; the rows' numbers, weighted ``1 / len`` (a mean over the
document's real queries), go into the layer's outputs with atomic additions, and the block's peak goes in packed
into one int64 (the weight's bits high, ``2³¹ − 1 − row`` low: the largest weight wins, then the first row) with an
atomic maximum.

Only batches as ``forward.BatchRunner`` pads them: right padding (document ``b`` sees keys ``0..len_b − 1``),
causal or not, float16/bfloat16/float32 q and k on one device. Anything else (T5's position bias, sliding windows,
a mask no such description fits, float64) takes the PyTorch path. ``tests/test_corpus_triton.py`` checks that the
two agree, through Triton's interpreter on the CPU and compiled on a GPU.
"""
from __future__ import annotations

import functools
import os

import torch

from models.core import tiles_triton
from models.core.triton_blocks import (
    key_range,
    load_block,
    online_step,
    row_normaliser,
    tl,
    triton,
    visible,
)

FIELDS = 7  # per (document, head): Σ-means of p ln p, distance, first key, diagonal, max weight, previous; induction
ROW_BITS = 2**31 - 1
BLOCKS = (64, 64)  # (query rows, keys) a program takes at a time; a document of the default 256 tokens is 4 × 4


def _statistics_kernel(Q, K, IDS, LENGTHS, ACC, PEAK, PEAK_KEY,
                       stride_qb, stride_qh, stride_qm, stride_qd,
                       stride_kb, stride_kh, stride_kn, stride_kd,
                       stride_ib, stride_ab, stride_ah, stride_pb, stride_ph, stride_yb, stride_yh,
                       heads, group, head_dim, scale_log2,
                       CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0) // heads
    head = tl.program_id(0) % heads
    first_row = tl.program_id(1) * BLOCK_M
    length = tl.load(LENGTHS + b)
    if first_row < length:  # a block of padding rows only: nothing to count
        rows = first_row + tl.arange(0, BLOCK_M)
        row_ok = rows < length
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < head_dim
        q = load_block(Q, b, head, rows, row_ok, dims, dim_ok, stride_qb, stride_qh, stride_qm,
                       stride_qd, UPCAST)
        row_ids = tl.load(IDS + b.to(tl.int64) * stride_ib + rows, mask=row_ok, other=-1)
        # right padding: document b's keys are 0..length − 1, no offset, no window
        lo, hi = key_range(first_row, first_row + BLOCK_M - 1, 0, length, 0, 0, CAUSAL, False)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        ps_i = tl.zeros([BLOCK_M], tl.float32)
        pd_i = tl.zeros([BLOCK_M], tl.float32)
        pt_i = tl.zeros([BLOCK_M], tl.float32)
        first_s = tl.zeros([BLOCK_M], tl.float32)
        first_n = tl.zeros([BLOCK_M], tl.float32)
        diagonal_s = tl.zeros([BLOCK_M], tl.float32)
        diagonal_n = tl.zeros([BLOCK_M], tl.float32)
        previous_s = tl.zeros([BLOCK_M], tl.float32)
        previous_n = tl.zeros([BLOCK_M], tl.float32)
        peak_s = tl.full([BLOCK_M], float("-inf"), tl.float32)
        peak_key = tl.zeros([BLOCK_M], tl.int32)
        for start in range(lo, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < hi
            k = load_block(K, b, head // group, cols, col_ok, dims, dim_ok, stride_kb, stride_kh,
                           stride_kn, stride_kd, UPCAST)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # (BLOCK_M, BLOCK_N), base 2
            seen, relative = visible(rows, row_ok, cols, col_ok, 0, length, 0, 0, CAUSAL, False)
            # the three cells read as they are (each is in exactly one block of the row)
            first_cell = seen & (cols[None, :] == 0)
            diagonal_cell = seen & (relative == 0)
            previous_cell = seen & (relative == -1)
            first_s += tl.sum(tl.where(first_cell, s, 0.0), 1)
            first_n += tl.sum(first_cell.to(tl.float32), 1)
            diagonal_s += tl.sum(tl.where(diagonal_cell, s, 0.0), 1)
            diagonal_n += tl.sum(diagonal_cell.to(tl.float32), 1)
            previous_s += tl.sum(tl.where(previous_cell, s, 0.0), 1)
            previous_n += tl.sum(previous_cell.to(tl.float32), 1)
            # the peak: the largest score off the first key and the diagonal, its first key on a tie
            candidate = tl.where(seen & (cols[None, :] != 0) & (relative != 0), s, float("-inf"))
            block_peak = tl.max(candidate, 1)
            block_key = start + tl.argmax(candidate, 1)
            better = block_peak > peak_s
            peak_key = tl.where(better, block_key, peak_key)
            peak_s = tl.where(better, block_peak, peak_s)
            # induction targets: key j (1 <= j < i) whose previous token is query i's token
            previous_ids = tl.load(IDS + b.to(tl.int64) * stride_ib + cols - 1, mask=col_ok & (cols >= 1), other=-2)
            target = seen & (cols[None, :] >= 1) & (relative < 0) & (previous_ids[None, :] == row_ids[:, None])
            m_i, l_i, ps_i, pd_i, p, alpha = online_step(m_i, l_i, ps_i, pd_i, s, seen, relative,
                                                         True)
            pt_i = pt_i * alpha + tl.sum(tl.where(target, p, 0.0), 1)
        has, safe_l, lse2 = row_normaliser(m_i, l_i)
        has = row_ok & has
        lse2 = tl.where(has, lse2, 0.0)  # the row's normaliser, base 2
        weight = tl.where(has, 1.0 / length.to(tl.float32), 0.0)  # a mean over the document's real queries
        plogp = 0.6931471805599453 * (ps_i / safe_l - lse2)  # Σ p ln p
        first = tl.where(first_n > 0, tl.exp2(first_s - lse2), 0.0)
        diagonal = tl.where(diagonal_n > 0, tl.exp2(diagonal_s - lse2), 0.0)
        previous = tl.where(previous_n > 0, tl.exp2(previous_s - lse2), 0.0)
        out = ACC + b.to(tl.int64) * stride_ab + head * stride_ah
        tl.atomic_add(out + 0, tl.sum(weight * plogp, 0))
        tl.atomic_add(out + 1, tl.sum(weight * pd_i / safe_l, 0))
        tl.atomic_add(out + 2, tl.sum(weight * first, 0))
        tl.atomic_add(out + 3, tl.sum(weight * diagonal, 0))
        tl.atomic_add(out + 4, tl.sum(weight / safe_l, 0))  # the row's largest weight, 2^(m − L)
        tl.atomic_add(out + 5, tl.sum(weight * previous, 0))
        tl.atomic_add(out + 6, tl.sum(tl.where(has, pt_i / safe_l, 0.0), 0))  # summed, not averaged
        tl.store(PEAK_KEY + b.to(tl.int64) * stride_yb + head * stride_yh + rows, peak_key, mask=row_ok)
        has_peak = has & (peak_s > float("-inf"))
        peak_p = tl.where(has_peak, tl.exp2(peak_s - lse2), 0.0)
        packed = (peak_p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (2147483647 - rows).to(tl.int64)
        packed = tl.where(has_peak, packed, -1)
        tl.atomic_max(PEAK + b.to(tl.int64) * stride_pb + head * stride_ph, tl.max(packed, 0))


@functools.lru_cache(maxsize=2)
def _kernel(interpret: bool):
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(_statistics_kernel)
    return triton.jit(_statistics_kernel)


def usable(query: torch.Tensor, key: torch.Tensor, position_bias) -> bool:
    """Whether this layer's q and k can take the kernel (the mask is checked apart: ``described``)."""
    if os.environ.get("ATTN_EXPLORER_CORPUS_KERNEL") == "torch":  # the PyTorch path everywhere (tests, benches)
        return False
    return (position_bias is None and query.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and key.dtype == query.dtype and key.device == query.device
            and query.shape[2] == key.shape[2] and tiles_triton.available(query.device))


def described(allowed: torch.Tensor, lengths: torch.Tensor) -> bool | None:
    """Whether ``allowed (B or 1, q, k)`` is right padding by ``lengths (B,)`` and causal (True), right padding
    alone (False), or neither (None: the PyTorch path)."""
    batch, width = lengths.shape[0], allowed.shape[-1]
    if allowed.shape[-2] != width:
        return None
    keys = torch.arange(width, device=allowed.device)[None, :] < lengths.to(allowed.device)[:, None]  # (B, k)
    padding = keys[:, None, :].expand(batch, width, width)
    whole = allowed.expand(batch, width, width)
    if torch.equal(whole, padding & torch.ones(width, width, dtype=torch.bool, device=allowed.device).tril()):
        return True
    if torch.equal(whole, padding):
        return False
    return None


def layer_statistics(query: torch.Tensor, key: torch.Tensor, scaling: float, causal: bool, ids: torch.Tensor,
                     lengths: torch.Tensor, out: torch.Tensor, peak: torch.Tensor, peak_key: torch.Tensor) -> None:
    """Add one layer's statistics into ``out (B, H, FIELDS)`` float32 (zeros before), ``peak (B, H)`` int64 (−1
    before: the packed peak, see the module) and ``peak_key (B, H, q)`` int32 (each row's peak key), from ``query
    (B, H, q, d)``, ``key (B, H_kv, k, d)``, the batch's token ``ids (B, q)`` and ``lengths (B,)`` int32."""
    batch, heads, width, head_dim = query.shape
    interpret = query.device.type == "cpu"
    upcast = interpret and query.dtype == torch.bfloat16  # the interpreter's numpy has no bfloat16 (tiles_triton)
    precision = "ieee" if query.dtype == torch.float32 or upcast else "tf32"
    block_m, block_n = BLOCKS
    _kernel(interpret)[(batch * heads, triton.cdiv(width, block_m))](
        query, key, ids, lengths, out, peak, peak_key,
        *query.stride(), *key.stride(), ids.stride(0), out.stride(0), out.stride(1), peak.stride(0), peak.stride(1),
        peak_key.stride(0), peak_key.stride(1), heads, heads // key.shape[1], head_dim, scaling * tiles_triton.LOG2E,
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PRECISION=precision, UPCAST=upcast)


def decode(out: torch.Tensor, peak: torch.Tensor, peak_key: torch.Tensor) -> torch.Tensor:
    """``(…, H, 10)`` in ``HeadStatistics``'s layout (the six means, induction, then the peak's value, query and
    key; value −1 where no query has a peak) from the kernel's outputs ``(…, H, FIELDS)``, ``(…, H)``, ``(…, H, q)``."""
    found = peak >= 0
    value = (peak >> 32).to(torch.int32).view(torch.float32)
    row = torch.where(found, ROW_BITS - (peak & 0xFFFFFFFF), 0)
    chosen = peak_key.gather(-1, row[..., None])[..., 0]
    peaks = torch.stack([torch.where(found, value, -1.0), row.to(torch.float32),
                         torch.where(found, chosen, 0).to(torch.float32)], dim=-1)
    return torch.cat([out, peaks], dim=-1)
