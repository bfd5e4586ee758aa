"""Measured quality of the mini MoE, written to its card: perplexity, load balance, expert specialisation.

- Perplexity ``exp(mean cross-entropy)`` per token on held-out text of the same generator (different seed), and
  bits per byte (independent of the tokenizer).
- Balance per layer: coefficient of variation of expert load and the Switch auxiliary loss ``E · Σ f_i P_i``
  (1 = balanced), see ``models.analysis.routing``.
- Specialisation: mutual information between token category and dispatched expert, against routing shuffled
  across tokens; both for the heuristic categories the page uses (word/code/number/punctuation) and for the
  generator's gold segment kind (prose/code/numbers).
Routing is read through ``models.families.moe.model.run``, the same capture code the page uses for hub models.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from models import families
from models.analysis import routing as stats
from models.core import loading
from models.core.inputs import TextInput
from models.core.specs import ModelSpec
from models.families.moe import model as moe
from models.minis.moe.data import KINDS, Segment

MAX_CHUNK_CHARS = 1200  # a few segments per run, well under the page's 512-token limit
MAX_CHUNK_TOKENS = 512  # a chunk is never cut: the page's limit, and well above what 1,200 characters make


def load_folder(folder: Path) -> loading.LoadedModel:
    spec = ModelSpec("moe", "mini-moe", "mini", str(Path(folder).resolve()), "project", "generated text")
    return families.load(spec, "cpu", "float32")


def perplexity(loaded: loading.LoadedModel, text: str, window: int = 512) -> tuple[float, float]:
    """(perplexity per token, bits per byte) over non-overlapping windows of ``text``."""
    ids = loaded.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    total_nats, predicted = 0.0, 0
    with torch.inference_mode():
        for start in range(0, ids.numel() - 1, window):
            chunk = ids[start:start + window + 1][None]
            if chunk.shape[1] < 2:
                break
            logits = loaded.model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum")
            total_nats += float(loss)
            predicted += chunk.shape[1] - 1
    return math.exp(total_nats / predicted), total_nats / math.log(2) / len(text.encode())


def _chunks(segments: list[Segment]) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """Group segments into texts of at most ``MAX_CHUNK_CHARS``, with each segment's (start, end, kind) span."""
    chunks, text, spans = [], "", []
    for segment in segments:
        if text and len(text) + len(segment.text) + 2 > MAX_CHUNK_CHARS:
            chunks.append((text, spans))
            text, spans = "", []
        if text:
            text += "\n\n"
        spans.append((len(text), len(text) + len(segment.text), segment.kind))
        text += segment.text
    if text:
        chunks.append((text, spans))
    return chunks


def collect_routing(loaded: loading.LoadedModel, segments: list[Segment]):
    """Route every chunk; returns (top_experts (L, T, k), probs (L, T, E), kept, categories, gold kinds)."""
    tops, probs, kept, categories, gold = [], [], [], [], []
    for text, spans in _chunks(segments):
        routing = moe.run(loaded, TextInput(text, MAX_CHUNK_TOKENS)).routing
        tops.append(routing.top_experts)
        probs.append(routing.probs)
        kept.append(routing.kept)
        categories += routing.categories
        for start, _ in routing.token_offsets:
            gold.append(next((kind for a, b, kind in spans if a <= start < b + 2), "prose"))
    return (np.concatenate(tops, axis=1), np.concatenate(probs, axis=1), np.concatenate(kept, axis=1),
            categories, gold)


def gold_specialisation(top_experts: np.ndarray, gold: list[str], shuffles: int = 200):
    """Like ``routing.specialisation`` with the generator's segment kinds as the categories."""
    mapped = [stats.CATEGORIES[KINDS.index(kind)] for kind in gold]  # relabel so the same code counts them
    return stats.specialisation(top_experts, mapped, shuffles)


def evaluate_folder(folder: Path, segments: list[Segment]) -> dict:
    loaded = load_folder(folder)
    text = "\n\n".join(s.text for s in segments)
    ppl, bpb = perplexity(loaded, text)
    top, probs, kept, categories, gold = collect_routing(loaded, segments)
    summary = stats.summarise(probs, top, kept)
    spec = stats.specialisation(top, categories)
    gold_spec = gold_specialisation(top, gold)
    num_experts = probs.shape[-1]
    return {
        "perplexity": round(ppl, 3), "bits_per_byte": round(bpb, 4), "eval_characters": len(text),
        "eval_tokens": int(top.shape[1]), "num_experts": num_experts, "top_k": int(top.shape[2]),
        "per_layer": {
            "load": np.round(summary.load, 4).tolist(),
            "cv": np.round(summary.cv, 4).tolist(),
            "aux_loss": np.round(summary.aux_loss, 4).tolist(),
            "entropy_nats": np.round(summary.entropy.mean(axis=1), 4).tolist(),
            "mi_category_bits": np.round(spec.observed, 4).tolist(),
            "mi_category_shuffled_bits": np.round(spec.shuffled_mean, 4).tolist(),
            "mi_category_shuffled_p95_bits": np.round(spec.shuffled_p95, 4).tolist(),
            "mi_kind_bits": np.round(gold_spec.observed, 4).tolist(),
            "mi_kind_shuffled_bits": np.round(gold_spec.shuffled_mean, 4).tolist(),
        },
        "category_entropy_bits": round(spec.category_entropy, 4),
        "category_counts": spec.counts,
        "mean_cv": round(float(summary.cv.mean()), 4),
        "mean_aux_loss": round(float(summary.aux_loss.mean()), 4),
        "mean_mi_category_bits": round(float(spec.observed.mean()), 4),
        "mean_mi_category_shuffled_bits": round(float(spec.shuffled_mean.mean()), 4),
    }


def card(m: dict) -> str:
    """The model card (markdown) from the measured numbers."""
    cfg, per = m["config"], m["per_layer"]
    rows = "\n".join(
        f"| {i} | {per['cv'][i]:.3f} | {per['aux_loss'][i]:.3f} | {per['entropy_nats'][i]:.3f} | "
        f"{per['mi_category_bits'][i]:.3f} | {per['mi_category_shuffled_bits'][i]:.3f} | "
        f"{per['mi_kind_bits'][i]:.3f} | {per['mi_kind_shuffled_bits'][i]:.3f} |"
        for i in range(len(per["cv"])))
    return f"""# mini-moe: a small mixture-of-experts language model trained by this project

**What it is.** A transformers `MixtralForCausalLM` trained from scratch: {cfg['num_hidden_layers']} layers,
hidden size {cfg['hidden_size']}, {cfg['num_attention_heads']} query heads sharing {cfg['num_key_value_heads']}
key/value heads, **{cfg['num_local_experts']} experts per layer, top-{cfg['num_experts_per_tok']} routing** (softmax,
renormalised over the chosen two), {m['parameters']:,} parameters (float32). Tokenizer: byte-level BPE with
{cfg['vocab_size']} tokens trained on the same text.

**Data.** Generated by `models/minis/moe/data.py` (seed {cfg['seed']}): English prose from a phrase grammar, small
Python functions and classes, and numbers (correct arithmetic, sequences, dated tables), mixed within documents.
{cfg['train_chars']:,} characters. No external data. Licence: same as this project.

**Training.** `python -m models.minis.moe.train` — one CPU thread, {m['steps']} steps of
{cfg['batch_size']} × {cfg['seq_len']} tokens ({m['tokens_seen']:,} tokens seen), AdamW, learning rate
{cfg['learning_rate']} with warm-up and cosine decay, plus the Switch load-balancing loss (Fedus et al. 2021, eq. 4)
applied per layer with coefficient {cfg['router_aux_loss_coef']}. Took {m['train_seconds'] / 60:.1f} minutes on a
machine shared with other jobs (the decay follows the {cfg['max_minutes']:g}-minute budget when steps run out of time).

## Measured on held-out generated text (seed {cfg['seed'] + 1}, {m['eval_characters']:,} characters, {m['eval_tokens']:,} tokens)
- **Perplexity:** {m['perplexity']:.2f} per token ({m['bits_per_byte']:.3f} bits per byte).
- **Load balance:** mean coefficient of variation of expert load {m['mean_cv']:.3f} (0 = perfectly even);
  Switch auxiliary loss {m['mean_aux_loss']:.3f} (1 = balanced, {m['num_experts']} = collapsed).
- **Specialisation:** mutual information between token category (word / code / number / punctuation) and the
  dispatched expert: {m['mean_mi_category_bits']:.3f} bits on average over layers, against
  {m['mean_mi_category_shuffled_bits']:.3f} bits with the routing shuffled across tokens (category entropy
  {m['category_entropy_bits']:.3f} bits is the ceiling). Tokens per category: {moe.per_category(m['category_counts'])}.

| layer | load CV | aux loss | router entropy (nats) | MI category (bits) | shuffled | MI segment kind (bits) | shuffled |
|---|---|---|---|---|---|---|---|
{rows}

MI "segment kind" uses the generator's gold labels (prose / code / numbers) instead of the per-token heuristic.

**Limits.** A toy: it has only seen this generator's small vocabulary, so ordinary English outside it splits into
short pieces and its perplexity means nothing beyond this data. Its experts can only specialise on surface form
(digits, indentation, keywords), because that is what its data offers; the Mixtral paper (§5) reports little topic
specialisation in real MoE models and routing that follows syntax more than domain.
"""
