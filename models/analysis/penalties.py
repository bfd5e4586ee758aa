"""What each decoding penalty does, on a real generation (``models/core/decoding.py`` has the processors).

``penalty_effect``: at one generated step, the model's raw next-token distribution (the context up to that step
through the model once) before and after each of the presence, frequency and repetition penalties.
``beam_hypotheses``: the prompt re-decoded by beam search, every returned hypothesis with its total log-probability
(recomputed by a teacher-forced forward) and its length-penalised score Σ log p / L^α, ranked both ways.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from models.core import decoding, text
from models.core.results import TextResult


def _generation(result: TextResult) -> tuple[int, ...]:
    if not isinstance(result, TextResult) or not result.generation or not result.token_ids:
        raise ValueError("Generate a continuation first: the penalties act on what was generated.")
    return result.token_ids


def _next_logits(loaded, ids: list[int]) -> torch.Tensor:
    """Raw next-token logits after ``ids``: ``(vocab,)`` float32."""
    model = loaded.model
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids], device=loaded.device), use_cache=False, **keep).logits
    return logits[0, -1].float().cpu()


@dataclass(frozen=True)
class PenaltyEffect:
    """At generated step ``step`` (1-based): ``candidates`` token ids ``(K,)`` with ``labels``, ``before``
    probabilities ``(K,)`` and ``after[name]`` ``(K,)`` for each penalty at ``values[name]``; ``counts`` ``(K,)``
    how often each was generated before this step, ``in_context`` whether it occurs anywhere before it (prompt
    included: what the repetition penalty sees); ``chosen`` the id generated at this step."""

    step: int
    context_tokens: int
    candidates: np.ndarray
    labels: list[str]
    before: np.ndarray
    after: dict[str, np.ndarray]
    values: dict[str, float]
    counts: np.ndarray
    in_context: np.ndarray
    chosen: int
    chosen_label: str
    model: str
    input_name: str


def penalty_effect(loaded, result: TextResult, options) -> PenaltyEffect:
    """``options``: ``step`` (1-based), ``presence``, ``frequency``, ``repetition`` and ``top`` (the candidates
    shown: the top ``top`` before and after each penalty, together)."""
    ids = _generation(result)
    steps = len(result.generation)
    if not 1 <= options.step <= steps:
        raise ValueError(f"step {options.step} does not exist: {steps} tokens were generated")
    position = result.generation[options.step - 1].position
    context = list(ids[:position])
    logits = _next_logits(loaded, context)  # (vocab,)
    values = {"presence": options.presence, "frequency": options.frequency, "repetition": options.repetition}
    context_ids = torch.tensor([context])
    before = torch.softmax(logits, -1)
    after = {name: torch.softmax(decoding.processor(name, value, result.prompt_length)(context_ids, logits[None])[0],
                                 -1) for name, value in values.items()}
    top = options.top
    chosen = set(before.topk(top).indices.tolist())
    for probabilities in after.values():
        chosen |= set(probabilities.topk(top).indices.tolist())
    candidates = np.array(sorted(chosen, key=lambda i: -float(before[i])))
    counts = decoding.token_counts(context_ids, logits.shape[0], result.prompt_length)[0]
    labels = [text.display_token(loaded.tokenizer.decode([int(i)])) for i in candidates]
    return PenaltyEffect(options.step, len(context), candidates, labels, before[candidates].numpy(),
                         {name: p[candidates].numpy() for name, p in after.items()}, values,
                         counts[candidates].numpy().astype(int), np.isin(candidates, context), int(ids[position]),
                         text.display_token(loaded.tokenizer.decode([int(ids[position])])), result.model.short_name,
                         result.input_name)


@dataclass(frozen=True)
class BeamHypotheses:
    """Beam search on the prompt: per returned hypothesis its ``texts``, generated ``lengths`` ``(B,)``,
    ``sum_logprobs`` ``(B,)`` (teacher-forced), ``scores`` ``(B,)`` = Σ log p / L^α, and ``library_scores`` ``(B,)``
    (transformers' own ``sequences_scores``)."""

    alpha: float
    beams: int
    texts: list[str]
    lengths: np.ndarray
    sum_logprobs: np.ndarray
    scores: np.ndarray
    library_scores: np.ndarray
    model: str
    input_name: str


def beam_hypotheses(loaded, result: TextResult, options) -> BeamHypotheses:
    """``options``: ``alpha`` (the length penalty) and ``beams``; as many new tokens as the generation had, no other
    penalty, every beam returned."""
    ids = _generation(result)
    if not 2 <= options.beams <= 8:
        raise ValueError("Beam search here uses 2 to 8 beams.")
    prompt = torch.tensor([ids[:result.prompt_length]], device=loaded.device)
    tokenizer = loaded.tokenizer
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    with torch.inference_mode():
        output = loaded.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                       num_beams=options.beams, num_return_sequences=options.beams,
                                       length_penalty=options.alpha, early_stopping=True,
                                       max_new_tokens=len(result.generation), pad_token_id=pad,
                                       output_scores=True, return_dict_in_generate=True)
    texts, lengths, sums = [], [], []
    for sequence in output.sequences.tolist():
        generated = sequence[result.prompt_length:]
        if eos is not None and eos in generated:
            generated = generated[:generated.index(eos) + 1]  # the EOS counts; padding after it does not
        full = sequence[:result.prompt_length] + generated
        with torch.inference_mode():
            logits = loaded.model(input_ids=torch.tensor([full], device=loaded.device), use_cache=False).logits[0]
        logprobs = torch.log_softmax(logits.float(), -1).cpu()
        sums.append(float(sum(logprobs[p - 1, full[p]] for p in range(result.prompt_length, len(full)))))
        lengths.append(len(generated))
        texts.append(tokenizer.decode(generated))
    lengths, sums = np.array(lengths), np.array(sums)
    scores = np.array([decoding.length_penalised_score(s, n, options.alpha) for s, n in zip(sums, lengths)])
    return BeamHypotheses(options.alpha, options.beams, texts, lengths, sums, scores,
                          output.sequences_scores.float().cpu().numpy(), result.model.short_name, result.input_name)
