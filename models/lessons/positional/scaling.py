"""RoPE beyond the training length: how Position Interpolation, NTK-aware scaling and YaRN change the frequencies.

RoPE turns pair i of a head by θ_i = b^(−2i/d) per position, a wavelength λ_i = 2π/θ_i. A model trained on L₀
positions has seen every angle m·θ_i for m < L₀; past L₀ the low-frequency pairs (λ_i > L₀) meet angles they never
saw. With a target factor s (new context s·L₀):

- **Position Interpolation** (Chen et al. 2023, eq. 2; transformers' ``linear``): θ'_i = θ_i / s — every position
  squeezed into the trained range, the high frequencies too (neighbours become harder to tell apart).
- **NTK-aware scaling** (bloc97 2023; Peng et al. 2023 §3.1): the base raised to b' = b·s^(d/(d−2)), so the highest
  frequency is untouched and the lowest is divided by exactly s. transformers' ``dynamic`` applies it with
  s_eff = s·L/L₀ − (s − 1) for the current length L (no change up to L₀).
- **YaRN** (Peng et al. 2023, §3.2–3.4; transformers' ``yarn``): "NTK-by-parts": pairs that turn more than
  β_fast = 32 times within L₀ keep θ_i, pairs that turn less than β_slow = 1 time are interpolated (θ_i / s), a
  linear ramp over the pair index in between (the authors' code and transformers ramp over the index, rounded out to
  whole pairs); and the attention logits are scaled by (0.1·ln s + 1)² (cos and sin each by 0.1·ln s + 1).

Every function returns float64 numpy, ``(d/2,)`` for frequencies; the tests compare them with hand-computed values and
with transformers' ``ROPE_INIT_FUNCTIONS``.
"""
from __future__ import annotations

import math

import numpy as np

from models.lessons.positional.formulas import alibi_slopes, rope_frequencies

SCALINGS = {"none": "no scaling", "pi": "Position Interpolation (linear)", "ntk": "NTK-aware (base × s^(d/(d−2)))",
            "yarn": "YaRN (NTK-by-parts + temperature)"}


def _check_factor(factor: float) -> None:
    if not factor >= 1:
        raise ValueError(f"the context factor s must be at least 1 (got {factor})")


def wavelengths(frequencies: np.ndarray) -> np.ndarray:
    """λ_i = 2π / θ_i, in positions: how many tokens one full turn of pair i takes."""
    return 2 * np.pi / np.asarray(frequencies, dtype=np.float64)


def pi_frequencies(rotary_dim: int, base: float, factor: float) -> np.ndarray:
    """Position Interpolation: θ_i / s."""
    _check_factor(factor)
    return rope_frequencies(rotary_dim, base) / factor


def ntk_base(rotary_dim: int, base: float, factor: float) -> float:
    """NTK-aware base b·s^(d/(d−2)): θ_0 = 1 stays, θ_{d/2−1} becomes exactly θ_{d/2−1} / s."""
    _check_factor(factor)
    return base * factor ** (rotary_dim / (rotary_dim - 2))


def ntk_frequencies(rotary_dim: int, base: float, factor: float) -> np.ndarray:
    return rope_frequencies(rotary_dim, ntk_base(rotary_dim, base, factor))


def dynamic_ntk_frequencies(rotary_dim: int, base: float, factor: float, length: int, trained: int) -> np.ndarray:
    """transformers' ``dynamic``: NTK-aware with s_eff = s·L/L₀ − (s − 1) at the current length L (L ≤ L₀: none)."""
    _check_factor(factor)
    length = max(length, trained)
    effective = factor * length / trained - (factor - 1)
    return rope_frequencies(rotary_dim, base * effective ** (rotary_dim / (rotary_dim - 2)))


def yarn_ramp(rotary_dim: int, base: float, trained: int, beta_fast: float = 32.0,
              beta_slow: float = 1.0) -> tuple[np.ndarray, float, float]:
    """YaRN's interpolation weight per pair, ``(d/2,)``: 0 keeps θ_i (pairs turning > β_fast times within L₀), 1
    interpolates (< β_slow turns), linear in the pair index between the two boundaries, which are the pair indices
    where L₀/λ_i equals β_fast and β_slow, rounded outwards (floor, ceil). Returns (ramp, low, high)."""
    def pair_index(turns: float) -> float:  # solve L₀·θ_i / 2π = turns for i
        return rotary_dim * math.log(trained / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), rotary_dim - 1)
    if high == low:
        high += 0.001
    index = np.arange(rotary_dim // 2, dtype=np.float64)
    return np.clip((index - low) / (high - low), 0.0, 1.0), float(low), float(high)


def yarn_frequencies(rotary_dim: int, base: float, factor: float, trained: int, beta_fast: float = 32.0,
                     beta_slow: float = 1.0) -> tuple[np.ndarray, float]:
    """YaRN's θ'_i = (1 − ramp_i)·θ_i + ramp_i·θ_i / s, and its attention factor 0.1·ln s + 1 (cos and sin are
    multiplied by it, so every logit by its square)."""
    _check_factor(factor)
    theta = rope_frequencies(rotary_dim, base)
    ramp, _, _ = yarn_ramp(rotary_dim, base, trained, beta_fast, beta_slow)
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return (1 - ramp) * theta + ramp * theta / factor, attention_factor


def scaled_frequencies(kind: str, rotary_dim: int, base: float, factor: float,
                       trained: int) -> tuple[np.ndarray, float]:
    """(θ' ``(d/2,)``, logit scale) of one scaling (``SCALINGS``); the logit scale is 1 except YaRN's."""
    if kind == "none":
        return rope_frequencies(rotary_dim, base), 1.0
    if kind == "pi":
        return pi_frequencies(rotary_dim, base, factor), 1.0
    if kind == "ntk":
        return ntk_frequencies(rotary_dim, base, factor), 1.0
    if kind == "yarn":
        frequencies, attention_factor = yarn_frequencies(rotary_dim, base, factor, trained)
        return frequencies, attention_factor ** 2
    raise ValueError(f"unknown RoPE scaling {kind!r}; use one of {', '.join(SCALINGS)}")


def score_by_distance(frequencies: np.ndarray, distances: np.ndarray, logit_scale: float = 1.0) -> np.ndarray:
    """The score of a query and a key that are the same unit vector spread evenly over the pairs, at each relative
    distance Δ: ``logit_scale · mean_i cos(Δ·θ_i)``, ``(len(distances),)``. 1 at Δ = 0; how fast and how regularly
    it falls is what the model learned to read within L₀."""
    angles = np.asarray(distances, dtype=np.float64)[:, None] * np.asarray(frequencies)[None, :]
    return logit_scale * np.cos(angles).mean(axis=1)


def alibi_bias_by_distance(num_heads: int, distances: np.ndarray) -> np.ndarray:
    """ALiBi's bias −m_h·Δ (Press et al. 2022), ``(num_heads, len(distances))``: linear in Δ, defined the same at
    any distance, so nothing changes past the trained length (the formula's reason for extrapolating)."""
    return -alibi_slopes(num_heads)[:, None] * np.asarray(distances, dtype=np.float64)[None, :]
