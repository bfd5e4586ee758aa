"""Decoding penalties as logits processors: what each does to the next-token logits.

- **Repetition penalty** (Keskar et al. 2019, CTRL §4.1; transformers' ``RepetitionPenaltyLogitsProcessor``): every
  token already in the context has its logit divided by θ when positive, multiplied by θ when negative (θ > 1
  makes it less likely, whatever its sign).
- **Presence and frequency penalties** (OpenAI's API, "Parameter details"): with c_j the number of times token j was
  generated so far, ``logit_j ← logit_j − c_j · α_frequency − [c_j > 0] · α_presence``. Presence is a flat
  penalty for having appeared at all; frequency grows with every repeat. Only generated tokens count (the prompt is
  not penalised), as OpenAI defines them; ``prompt_length`` says where the prompt ends.
- **Length penalty** (beam search; Wu et al. 2016 GNMT's idea, transformers' form): a finished hypothesis is ranked
  by ``Σ log p / L^α`` with L its generated length: α = 0 ranks by total log-probability (favouring short
  hypotheses, every token costs), α > 0 divides the cost by the length and lets longer ones win.

Each processor is a plain callable ``(input_ids (batch, T), scores (batch, vocab)) -> scores`` that transformers'
``generate`` accepts in ``logits_processor``.
"""
from __future__ import annotations

import torch


def token_counts(input_ids: torch.Tensor, vocab: int, prompt_length: int = 0) -> torch.Tensor:
    """How often each token id occurs in ``input_ids[:, prompt_length:]``: ``(batch, vocab)`` float."""
    generated = input_ids[:, prompt_length:]
    counts = torch.zeros(input_ids.shape[0], vocab, dtype=torch.float32, device=input_ids.device)
    return counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=torch.float32))


class PresencePenalty:
    """``logit_j −= α`` for every token generated at least once (after ``prompt_length``)."""

    def __init__(self, penalty: float, prompt_length: int = 0):
        self.penalty, self.prompt_length = float(penalty), prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen = token_counts(input_ids, scores.shape[-1], self.prompt_length) > 0
        return scores - self.penalty * seen.to(scores.dtype)


class FrequencyPenalty:
    """``logit_j −= α · c_j``, c_j = times token j was generated (after ``prompt_length``)."""

    def __init__(self, penalty: float, prompt_length: int = 0):
        self.penalty, self.prompt_length = float(penalty), prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores - self.penalty * token_counts(input_ids, scores.shape[-1], self.prompt_length).to(scores.dtype)


class RepetitionPenalty:
    """CTRL's penalty over the whole context (prompt included, as transformers applies it): a seen token's logit is
    divided by θ if positive, multiplied by θ if negative."""

    def __init__(self, penalty: float):
        if penalty <= 0:
            raise ValueError("The repetition penalty must be above 0 (1.0 = off).")
        self.penalty = float(penalty)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen = token_counts(input_ids, scores.shape[-1]) > 0
        penalised = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return torch.where(seen, penalised, scores)


def length_penalised_score(sum_logprobs: float, length: int, alpha: float) -> float:
    """A finished beam hypothesis's score: ``Σ log p / L^α`` (L: generated tokens)."""
    if length < 1:
        raise ValueError("a hypothesis has at least one generated token")
    return sum_logprobs / length ** alpha


PENALTIES = {"presence": "presence penalty", "frequency": "frequency penalty", "repetition": "repetition penalty"}


def processor(name: str, value: float, prompt_length: int = 0):
    """The processor of ``PENALTIES[name]`` at ``value`` (presence/frequency count after ``prompt_length``)."""
    if name == "presence":
        return PresencePenalty(value, prompt_length)
    if name == "frequency":
        return FrequencyPenalty(value, prompt_length)
    if name == "repetition":
        return RepetitionPenalty(value)
    raise ValueError(f"unknown penalty {name!r}; use one of {', '.join(PENALTIES)}")
