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

``beam_search`` is the search of the decoders this project runs step by step (the captioning and
translation minis, the Bergamot translator); transformers models use their own ``generate``.
"""
from __future__ import annotations

from typing import Any, Callable

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


def _rows(state: Any, rows: torch.Tensor) -> Any:
    """The hypotheses ``rows`` of a decoder state: a tensor (n, …), a tuple of them, or an object
    with ``select``."""
    if isinstance(state, torch.Tensor):
        return state[rows]
    if isinstance(state, tuple):
        return tuple(part[rows] for part in state)
    return state.select(rows)


Step = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]]


def beam_search(step: Step, state: Any, *, start: int, end: int, beams: int, max_new: int,
                shrinking: bool = False, alpha: float = 1.0, words: torch.Tensor | None = None,
                device: torch.device | str = "cpu") -> list[int]:
    """The generated ids (``end`` included when reached) of the best hypothesis, ranked by
    ``Σ log p / L^α``.

    ``step(previous (n,), state of those n hypotheses) -> (log-probabilities (n, columns), the
    state after)``; ``start`` is the token before the first; ``words`` (columns,) the token id of
    each column (a shortlist; None: column = id); ``device`` where ``previous`` goes. Two ways to
    end a hypothesis:

    - transformers' (``shrinking`` False): the ``2 · beams`` best continuations are read in order
      until ``beams`` live ones are found; one that ends is put aside and the beam stays ``beams``
      wide. The search stops once ``beams`` have ended or none is live; the unfinished count only
      when none ended. ``beams`` 1 is greedy.
    - Marian's (``shrinking``): each ended hypothesis takes one place from the beam (the
      ``beams − ended`` best continuations go on), and the last step ends every hypothesis.
      ``beams`` 1 is greedy by argmax."""
    live: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float]] = []

    def token(column: int) -> int:
        return column if words is None else int(words[column])

    for index in range(max_new):
        previous = torch.tensor([h[0][-1] if h[0] else start for h in live], device=device)
        log_probs, after = step(previous, state)
        if shrinking and beams == 1:
            column = int(log_probs[0].argmax())
            sequence = live[0][0] + [token(column)]
            live = [(sequence, live[0][1] + float(log_probs[0, column]))]
            state = after
            if sequence[-1] == end:
                return sequence
            continue
        width = beams - len(finished) if shrinking else 2 * beams
        totals = torch.tensor([h[1] for h in live], device=log_probs.device)[:, None] + log_probs
        scores, flat = totals.view(-1).topk(min(width, totals.numel()))
        kept, rows = [], []
        for score, position in zip(scores.tolist(), flat.tolist()):
            row, column = divmod(position, log_probs.shape[-1])
            sequence = live[row][0] + [token(column)]
            if sequence[-1] == end or (shrinking and index == max_new - 1):
                finished.append((sequence, score))
            else:
                kept.append((sequence, score))
                rows.append(row)
            if not shrinking and len(kept) == beams:
                break
        if not kept or len(finished) >= beams:
            break
        live, state = kept, _rows(after, torch.tensor(rows, device=log_probs.device))
    return max(finished or live, key=lambda f: length_penalised_score(f[1], len(f[0]), alpha))[0]
