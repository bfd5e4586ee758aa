"""Measured quality of the translation minis on held-out generated sentences.

- Exact-match accuracy: greedy output equals the reference French token for token; also per source-length bucket,
  which is where the fixed-context GRU (Cho et al. 2014) falls behind the attentive models (Bahdanau et al. 2015,
  fig. 2).
- Alignment error rate (``models.analysis.alignment``) of attention against the grammar's gold links, with the
  reference translation forced through the decoder (so target words are the gold words): for the Transformer per
  layer and head, per layer averaged over heads, and averaged over all layers and heads; for the GRU its single
  additive attention. Attention is merged to words (sum over source pieces, mean over target pieces), ``</s>`` is
  left out, and each target word aligns to its most-attended source word.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from models.analysis import alignment
from models.minis.translation.grammar import SentencePair
from models.minis.translation.rnn import GRUTranslator

LENGTH_BUCKETS = ((1, 9), (10, 14), (15, 19), (20, 24), (25, 29), (30, 99))  # source words, inclusive


def bucket_label(low: int, high: int) -> str:
    return f"{low}+" if high >= 99 else f"{low}–{high}"


def _batches(items: Sequence, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


@torch.no_grad()
def gru_greedy(model: GRUTranslator, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               max_new_tokens: int) -> list[list[int]]:
    """Batched greedy decoding -> token ids per sentence, without the final ``</s>``."""
    annotations, projected, summary, state, source_mask = model.start_state(input_ids, attention_mask)
    batch = input_ids.shape[0]
    previous = torch.full((batch,), model.config.decoder_start_token_id, dtype=torch.long)
    outputs = [[] for _ in range(batch)]
    finished = torch.zeros(batch, dtype=torch.bool)
    for _ in range(max_new_tokens):
        log_probs, state, _ = model.step(previous, state, annotations, projected, summary, source_mask)
        previous = log_probs.argmax(-1)
        for i in range(batch):
            if not finished[i] and previous[i].item() != model.config.eos_token_id:
                outputs[i].append(previous[i].item())
        finished |= previous == model.config.eos_token_id
        if finished.all():
            break
    return outputs


@torch.no_grad()
def translate_ids(kind: str, model, tokenizer, sentences: Sequence[str], batch_size: int = 100) -> list[list[int]]:
    """Greedy translations (token ids, no specials) for ``kind`` "transformer" or "gru"."""
    out: list[list[int]] = []
    for chunk in _batches(list(sentences), batch_size):
        enc = tokenizer(chunk, return_tensors="pt", padding=True)
        longest = int(enc["attention_mask"].sum(-1).max())
        limit = 2 * longest + 10
        if kind == "transformer":
            generated = model.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=limit)
            special = set(tokenizer.all_special_ids)
            out.extend([[t for t in row.tolist() if t not in special] for row in generated])
        else:
            out.extend(gru_greedy(model, enc["input_ids"], enc["attention_mask"], limit))
    return out


def exact_match(kind: str, model, tokenizer, pairs: Sequence[SentencePair]) -> dict:
    """Accuracy overall and per source-length bucket, plus a few failures to show on the card."""
    predictions = translate_ids(kind, model, tokenizer, [p.english for p in pairs])
    references = [tokenizer(p.french, add_special_tokens=False)["input_ids"] for p in pairs]
    correct = [pred == ref for pred, ref in zip(predictions, references)]
    by_length = []
    for low, high in LENGTH_BUCKETS:
        chosen = [c for c, p in zip(correct, pairs) if low <= len(p.en_words) <= high]
        if chosen:
            by_length.append({"bucket": bucket_label(low, high), "low": low, "high": high, "count": len(chosen),
                              "accuracy": float(np.mean(chosen))})
    failures = [{"english": p.english, "reference": p.french, "output": tokenizer.decode(pred)}
                for c, p, pred in zip(correct, pairs, predictions) if not c][:5]
    return {"exact_match": float(np.mean(correct)), "count": len(pairs), "by_length": by_length,
            "failures": failures}


def _word_level(pieces_src: list[str], pieces_tgt: list[str], weights: np.ndarray, pair: SentencePair,
                specials: set[str]) -> np.ndarray | None:
    """(..., tgt pieces, src pieces) -> (..., fr words, en words) over real words only; None if the pieces do not
    regroup into the grammar's words (never expected; counted, not hidden)."""
    src_groups = alignment.word_groups(pieces_src, specials)
    tgt_groups = alignment.word_groups(pieces_tgt, specials)
    src_real = [g for g in src_groups if pieces_src[g[0]] not in specials]
    tgt_real = [g for g in tgt_groups if pieces_tgt[g[0]] not in specials]
    if (alignment.word_labels(pieces_src, src_real) != pair.en_words
            or alignment.word_labels(pieces_tgt, tgt_real) != pair.fr_words):
        return None
    return alignment.merge_to_words(weights, tgt_real, src_real)


def _forced_batches(tokenizer, pairs: Sequence[SentencePair], batch_size: int):
    for chunk in _batches(list(pairs), batch_size):
        enc = tokenizer([p.english for p in chunk], text_target=[p.french for p in chunk], return_tensors="pt",
                        padding=True)
        labels = enc.pop("labels")
        decoder_input = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)  # <pad> starts
        yield chunk, enc, labels, decoder_input


@torch.no_grad()
def transformer_alignment(model, tokenizer, pairs: Sequence[SentencePair], batch_size: int = 50) -> dict:
    """AER per (layer, head), per layer (head-averaged attention) and for all layers and heads averaged.

    Two readings of the decoder's rows: "produced" (the row that predicts output word t, the page's reading) and
    "shifted" (the row whose input is word t, as in Chen et al. 2020's shift-att); the first is the headline.
    Needs a model whose cross-attention weights are returned (``output_attentions`` with eager attention): the
    training script's own check, independent of the app's capture path."""
    specials = set(tokenizer.all_special_tokens)
    layers = model.config.decoder_layers
    heads = model.config.decoder_attention_heads
    readings = ("produced", "shifted")
    per_head = {r: [[[] for _ in range(heads)] for _ in range(layers)] for r in readings}
    per_layer = {r: [[] for _ in range(layers)] for r in readings}
    overall = {r: [] for r in readings}
    skipped = 0
    for chunk, enc, labels, decoder_input in _forced_batches(tokenizer, pairs, batch_size):
        out = model(**enc, decoder_input_ids=decoder_input, output_attentions=True)
        cross = torch.stack(out.cross_attentions, dim=1).float().numpy()  # (B, layers, heads, T, S)
        for b, pair in enumerate(chunk):
            src_len, tgt_len = int(enc["attention_mask"][b].sum()), int((labels[b] != tokenizer.pad_token_id).sum())
            src = tokenizer.convert_ids_to_tokens(enc["input_ids"][b, :src_len].tolist())
            tgt = tokenizer.convert_ids_to_tokens(labels[b, :tgt_len].tolist())
            produced = cross[b, :, :, :tgt_len, :src_len]
            shifted = np.zeros_like(produced)  # row t = the step that read output piece t (none for </s>)
            shifted[:, :, :-1] = cross[b, :, :, 1:tgt_len, :src_len]
            sure = set(pair.alignment)
            for reading, weights in (("produced", produced), ("shifted", shifted)):
                words = _word_level(src, tgt, weights, pair, specials)
                if words is None:
                    skipped += 1
                    continue
                for layer in range(layers):
                    for head in range(heads):
                        per_head[reading][layer][head].append((alignment.hard_alignment(words[layer, head]), sure))
                    per_layer[reading][layer].append((alignment.hard_alignment(words[layer].mean(0)), sure))
                overall[reading].append((alignment.hard_alignment(words.mean((0, 1))), sure))
    result = {"sentences": len(overall["produced"]), "skipped": skipped}
    for reading in readings:
        head_aer = [[alignment.corpus_alignment_error_rate(cell) for cell in row] for row in per_head[reading]]
        best = min(((l, h) for l in range(layers) for h in range(heads)), key=lambda lh: head_aer[lh[0]][lh[1]])
        summary = {"per_head": head_aer,
                   "per_layer": [alignment.corpus_alignment_error_rate(r) for r in per_layer[reading]],
                   "all_layers_average": alignment.corpus_alignment_error_rate(overall[reading]),
                   "best_head": {"layer": best[0], "head": best[1], "aer": head_aer[best[0]][best[1]]}}
        if reading == "produced":
            result.update(summary)
        else:
            result["shifted"] = summary
    return result


@torch.no_grad()
def gru_alignment(model: GRUTranslator, tokenizer, pairs: Sequence[SentencePair], batch_size: int = 100) -> dict:
    """AER of the additive attention (one 'head')."""
    specials = set(tokenizer.all_special_tokens)
    links, skipped = [], 0
    for chunk, enc, labels, decoder_input in _forced_batches(tokenizer, pairs, batch_size):
        _, weights = model(enc["input_ids"], enc["attention_mask"], decoder_input)
        weights = weights.numpy()  # (B, T, S)
        for b, pair in enumerate(chunk):
            src_len, tgt_len = int(enc["attention_mask"][b].sum()), int((labels[b] != tokenizer.pad_token_id).sum())
            src = tokenizer.convert_ids_to_tokens(enc["input_ids"][b, :src_len].tolist())
            tgt = tokenizer.convert_ids_to_tokens(labels[b, :tgt_len].tolist())
            words = _word_level(src, tgt, weights[b, :tgt_len, :src_len], pair, specials)
            if words is None:
                skipped += 1
                continue
            links.append((alignment.hard_alignment(words), set(pair.alignment)))
    return {"aer": alignment.corpus_alignment_error_rate(links), "sentences": len(links), "skipped": skipped}
