"""The logit lens (nostalgebraist 2020): what each layer of a causal LM would predict if the model stopped there.

The residual stream after block ``l`` goes through the model's own final norm and unembedding, exactly as the last
block's output does; the last entry is the model's output itself (transformers returns it already normed, so it is
unembedded as it is and equals the model's logits). It reads the stream the prompt run kept
(``TextResult.residual``): no second forward. Unembedding costs ``positions × vocabulary × d_model`` per layer —
for SmolLM2 (49,152 tokens, d 576) 31 layers × 32 positions is about 56 GFLOP, a second or two on a laptop CPU — so
it runs for a window of at most ``MAX_POSITIONS`` positions, the ones a person reads.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from models.core import memory, sites, text
from models.core.loading import text_out_of_memory
from models.core.results import RunResult, TextResult

MAX_POSITIONS = 64  # a readable grid, and a bounded cost per layer
TOP_K = 5  # candidates per cell (the tooltip)
CHUNK_ROWS = 256  # (layer, position) rows unembedded at once


@dataclass(frozen=True)
class Lens:
    """The lens over ``positions``; arrays are indexed ``[layer, position]`` with layer 0 = the embeddings and the
    last layer = the model's output (``layers`` blocks in between)."""

    model: str
    input_name: str
    tokens: tuple[str, ...]  # every token of the input, for labels
    positions: tuple[int, ...]  # the positions read, in order
    top_ids: np.ndarray  # (layers + 1, P, TOP_K) int64, best first
    top_tokens: tuple[tuple[tuple[str, ...], ...], ...]  # the same, as display strings
    top_probs: np.ndarray  # (layers + 1, P, TOP_K) float32
    final_ids: np.ndarray  # (P,) the model's own top-1 next token at each position
    final_tokens: tuple[str, ...]
    final_probs: np.ndarray  # (layers + 1, P) probability each layer gives the model's final prediction
    final_ranks: np.ndarray  # (layers + 1, P) its rank in each layer's distribution (0 = top)
    stream: str = ""  # whose residual stream: "" a language model's, "decoder" an encoder–decoder's decoder

    @property
    def num_layers(self) -> int:
        """Blocks between the embeddings and the output."""
        return self.top_ids.shape[0] - 1

    def layer_label(self, layer: int) -> str:
        return "embeddings" if layer == 0 else f"layer {layer}" + (" (output)" if layer == self.num_layers else "")


def window(n: int, last: int, count: int) -> range:
    """The ``count`` positions ending at ``last`` (negative: from the end), checked with a message a user can act
    on."""
    if not 1 <= count <= MAX_POSITIONS:
        raise ValueError(f"the logit lens reads 1 to {MAX_POSITIONS} positions at a time, not {count}")
    end = last + n if last < 0 else last
    if not 0 <= end < n:
        raise ValueError(f"position {last} is outside the input's {n} tokens (0 to {n - 1}, or -1 for the last)")
    return range(max(0, end - count + 1), end + 1)


def final_norm_and_unembedding(model):
    """The causal LM's final norm and its unembedding (LM head) (``sites.of``)."""
    found = sites.of(model)
    return found.require("final_norm", "the logit lens"), found.require("unembedding", "the logit lens")


def residual_window(loaded, ids: list[int], start: int, stop: int) -> np.ndarray:
    """The residual stream ``(layers + 1, stop − start, d_model)`` float32 at positions ``start:stop`` of ``ids``,
    from a forward over ``ids[:stop]`` only (a causal model's stream at a position depends on no later token): what
    the lens re-runs for a window a long prompt's run did not keep."""
    import inspect

    import torch

    model = loaded.model
    input_ids = torch.tensor([ids[:stop]], device=loaded.device)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with text_out_of_memory(loaded.device, stop), torch.inference_mode(), \
            sites.residual_window(model, start, stop) as slices:
        model(input_ids=input_ids, use_cache=False, **keep)
    memory.release_freed_heap()
    return torch.stack(slices).float().cpu().numpy()


def logit_lens(loaded, result: RunResult, options) -> Lens:
    """The lens of ``result`` (a prompt run that kept its residual stream) over ``options.positions`` positions
    ending at ``options.last``."""
    residual = result.residual if isinstance(result, TextResult) else None
    if residual is None:
        raise ValueError("this run kept no residual stream: the logit lens reads a language model's prompt run")
    start = result.residual_start
    positions = window(start + residual.shape[1], options.last, options.positions)
    if positions.start >= start:  # kept by the run: no second forward
        stream, kept = residual, range(positions.start - start, positions.stop - start)
    else:  # a long prompt's run kept only its last positions: re-run the model up to this window's end
        if len(result.token_ids) != start + residual.shape[1]:
            raise ValueError("this run kept the residual stream of its last positions only, and not the token ids "
                             "to re-read the others: choose a window ending at the last position")
        stream = residual_window(loaded, list(result.token_ids), positions.start, positions.stop)
        kept = range(0, len(positions))
    norm, unembed = final_norm_and_unembedding(loaded.model)
    found = lens_of_stream(stream, kept, norm, unembed, next(unembed.parameters()), loaded.tokenizer,
                           result.model.short_name, result.input_name, tuple(result.tokens))
    return dataclasses.replace(found, positions=tuple(positions))


def lens_of_stream(residual: np.ndarray, positions: range, norm, unembed, parameter, tokenizer, model: str,
                   input_name: str, tokens: tuple[str, ...], stream: str = "") -> Lens:
    """The lens of a residual stream ``(layers + 1, tokens, d)`` (the last entry normed already) at ``positions``:
    ``norm`` then ``unembed`` (a module or any function of ``(rows, d)``) on every other entry. ``parameter``: a tensor
    of the unembedding, for its device and dtype."""
    import torch

    last, count = residual.shape[0] - 1, len(positions)
    with torch.inference_mode():
        states = torch.from_numpy(residual[:, positions.start:positions.stop].copy())  # (layers + 1, P, d)
        states = states.to(device=parameter.device, dtype=parameter.dtype)
        states = torch.cat([norm(states[:last]), states[last:]])  # the output is normed already
        rows = states.reshape(-1, states.shape[-1])  # layer-major: row = layer * P + position
        # the output rows first: they name the final prediction that every layer is read for
        final = unembed(rows[-count:]).float().argmax(-1)
        finals = final.repeat(last + 1)
        top_ids, top_probs, chosen, ranks = [], [], [], []
        # every layer through one unembedding, in chunks of rows: the 49,152 × 576 matrix is read once per chunk
        # (reading it once per layer made 16 positions as slow as 64), and a chunk's logits stay ~50 MB
        for begin in range(0, rows.shape[0], CHUNK_ROWS):
            logits = unembed(rows[begin:begin + CHUNK_ROWS]).float()
            normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)  # probabilities without a softmax copy
            values, indices = logits.topk(TOP_K, dim=-1)
            picked = logits.gather(1, finals[begin:begin + CHUNK_ROWS, None])
            top_ids.append(indices)
            top_probs.append((values - normaliser).exp())
            chosen.append((picked - normaliser).exp()[:, 0])
            ranks.append((logits > picked).sum(-1))

    def grid(parts, dtype):
        return torch.cat(parts).reshape(last + 1, count, *parts[0].shape[1:]).cpu().numpy().astype(dtype)

    decode = _decoder(tokenizer)
    top_ids_array = grid(top_ids, np.int64)
    return Lens(
        model=model, input_name=input_name, tokens=tokens, positions=tuple(positions), top_ids=top_ids_array,
        top_tokens=tuple(tuple(tuple(decode(i) for i in cell) for cell in layer) for layer in top_ids_array),
        top_probs=grid(top_probs, np.float32), final_ids=top_ids_array[-1, :, 0].copy(),
        final_tokens=tuple(decode(i) for i in top_ids_array[-1, :, 0]),
        final_probs=grid(chosen, np.float32), final_ranks=grid(ranks, np.int64), stream=stream)


def decoder_logit_lens(loaded, result: RunResult, options) -> Lens:
    """The logit lens of an encoder–decoder's decoder, one position per output step: the decoder's residual stream
    after each layer (one teacher-forced forward over the translation, as the run's own capture forward) through its
    final norm, when it has one, and the LM head with its final-logits bias (Marian)."""
    import torch

    output = getattr(result, "output", None)
    model = loaded.model
    decoder = getattr(getattr(model, "model", None), "decoder", None) if output is not None else None
    if decoder is None or not hasattr(model, "get_output_embeddings"):
        raise ValueError("the decoder's logit lens reads a Transformer translation (the GRU models have no layers "
                         "of residual stream)")
    decoder_input = [model.config.decoder_start_token_id] + list(output.output_ids[:-1])
    source = torch.tensor([list(output.source_ids)], device=loaded.device)
    with torch.inference_mode():
        states = model(input_ids=source, attention_mask=torch.ones_like(source),
                       decoder_input_ids=torch.tensor([decoder_input], device=loaded.device), use_cache=False,
                       output_hidden_states=True).decoder_hidden_states
    residual = torch.stack([state[0] for state in states]).float().cpu().numpy()  # (layers + 1, steps, d)
    positions = window(residual.shape[1], options.last, options.positions)
    head = model.get_output_embeddings()
    bias = getattr(model, "final_logits_bias", None)
    norm = getattr(decoder, "layer_norm", None) or (lambda x: x)  # post-norm decoders (Marian): states are normed

    def unembed(rows):
        return head(rows) if bias is None else head(rows) + bias[0].to(rows.dtype)

    return lens_of_stream(residual, positions, norm, unembed, next(head.parameters()), loaded.tokenizer,
                          result.model.short_name, result.input_name, tuple(output.decoder_input_tokens), "decoder")


def _decoder(tokenizer):
    cache: dict[int, str] = {}

    def decode(token_id) -> str:
        token_id = int(token_id)
        if token_id not in cache:
            cache[token_id] = text.display_token(tokenizer.decode([token_id]))
        return cache[token_id]
    return decode
