"""The encoder–decoder translator's adapter (Marian/BART, the mini Transformer en→fr) for the shared
explanations (models/analysis/attribution.py) and faithfulness curves.

Target: **one output token of the translation**, chosen by its position ``t``: its logit at decoder
row ``t`` with the decoder teacher-forced on the translation the model produced (so the target word
stays fixed while the source changes). Units: the source tokens (not the closing </s>). A removed
source token's embedding is replaced by the mean of the (shared) embedding matrix, times the model's
embedding scale, positions kept; the decoder input never changes. The attention methods follow the
source through cross-attention: raw attention and value norms read the last decoder layer's
cross-attention row ``t``; rollout and gradient rollout use Chefer et al. 2021b's encoder–decoder
rules (``relevance.encoder_decoder_rollout``). In ALTI's place, **value zeroing** (Mohebbi et al.
2023) adapted to cross-attention: source token ``j``'s value vector is zeroed in every decoder
layer's cross-attention and the cosine distance of the decoder's last hidden state at row ``t``
(what the LM head reads) to the unzeroed one is its score (``methods.ValueZeroing``). ALTI is not
offered (it needs ALTI+'s rules for cross-attention, Ferrando et al. 2022b). The GRU translators
have no Transformer attention to explain."""
from __future__ import annotations

import torch

from models.analysis.attribution import Explainable
from models.analysis.methods import SHARED
from models.analysis import records
from models.core import hooks
from models.families.translation import model as translation

REPLACEMENTS = {"mean": "the mean of the embedding matrix (an 'average token'), positions kept; the decoder input "
                        "(the translation, teacher-forced) is unchanged"}
NO_DECODER_SELF_ATTENTION = (
    "This model's decoder has no self-attention (an SSRU recurrent cell carries the earlier output words), so "
    "rollout and gradient rollout carry relevance through the encoder's self-attention and the cross-attention "
    "only: what the recurrent cell passes between output positions is in no attention map, and the rules treat it "
    "as nothing. The curves and Integrated Gradients read the model itself (the recurrence included); target "
    "probabilities are over the whole vocabulary, not the shortlist the decoder chose from.")
ENCODER_DECODER_METHODS = tuple("value_zeroing" if m == "alti" else m for m in SHARED)


def output_choices(result) -> list[tuple[int, str]]:
    """(position, label) of each output token that can be a target: every produced token but the
    closing </s>."""
    output = result.output
    return [(t, token) for t, token in enumerate(output.output_tokens)
            if not (t == len(output.output_tokens) - 1 and token in ("</s>", "<\\s>"))] or \
        [(t, token) for t, token in enumerate(output.output_tokens)]


def from_result(loaded, result, target, replacement: str = "mean", batch_size: int = 32) -> Explainable:
    """The adapter for a translation: ``target`` the output position (0-based; None: the first
    output token)."""
    if replacement not in REPLACEMENTS:
        raise ValueError(f"a removed token can be replaced by: {', '.join(REPLACEMENTS)} (not {replacement!r})")
    if not translation.architecture(loaded).startswith("transformer"):
        raise ValueError(f"{loaded.spec.key} is a GRU translator: the explanations read Transformer attention "
                         "(choose the mini Transformer en→fr or a Marian model)")
    output = getattr(result, "output", None)
    if output is None or not output.output_ids:
        raise ValueError("explanations read a translation run (this run produced no output)")
    position = 0 if target is None or target == "" else target
    try:
        position = int(position)
    except (TypeError, ValueError):
        raise ValueError(f"the target is an output position (0..{len(output.output_ids) - 1}), not {target!r}")
    if not 0 <= position < len(output.output_ids):
        raise ValueError(f"output position {position} does not exist: the translation has positions "
                         f"0..{len(output.output_ids) - 1}")
    model, tokenizer = loaded.model, loaded.tokenizer
    special = set(tokenizer.all_special_ids)
    source_ids = list(output.source_ids)
    units = tuple(i for i, token in enumerate(source_ids) if token not in special)
    if len(units) < 2:
        raise ValueError("the source is a single token: there is nothing to compare it with or remove. Type a longer "
                         "sentence.")
    device = next(model.parameters()).device
    encoder = model.get_encoder()
    table, scale = encoder.embed_tokens, getattr(encoder, "embed_scale", 1.0) or 1.0
    start = model.config.decoder_start_token_id
    decoder_ids = torch.tensor([[start, *output.output_ids[:-1]]], device=device)  # row t produces output_ids[t]
    with torch.no_grad():
        embeddings = table(torch.tensor([source_ids], device=device)) * scale
        baseline = embeddings.clone()  # </s> is no unit: it stays in the baseline too (IG's path)
        baseline[:, list(units)] = table.weight.mean(0) * scale

    def logits(batch_embeddings):
        batch = len(batch_embeddings)
        mask = torch.ones(batch_embeddings.shape[:2], dtype=torch.long, device=device)
        found = model(inputs_embeds=batch_embeddings, attention_mask=mask,
                      decoder_input_ids=decoder_ids.expand(batch, -1), use_cache=False).logits
        return found[:, position]

    records.attention_sites(model)  # an architecture whose attention cannot be found is refused now, not later
    decoder = model.get_decoder()

    def zeroed(keep):  # (B, S) -> (B, D): the decoder's output at row ``position``, values zeroed where keep is 0
        kept = {}

        def keep_output(module, args, out) -> None:  # returns None: the output is unchanged
            kept["h"] = out[0]

        with hooks.installed(hooks.after(decoder, keep_output)), records.zeroing_values(model, keep):
            logits(embeddings.expand(len(keep), -1, -1))
        return kept["h"][:, position]

    target_id = int(output.output_ids[position])
    name = f"{output.output_tokens[position]} (output position {position})"
    return Explainable(embeddings, baseline, units, position, target_id, name, logits,
                       lambda: records.recording(model),
                       tuple(output.source_tokens[i] for i in units),
                       REPLACEMENTS[replacement], batch_size, methods=ENCODER_DECODER_METHODS,
                       target_kind="an output token, teacher-forced", zeroed=zeroed)
