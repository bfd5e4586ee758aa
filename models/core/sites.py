"""Where things are in a transformers text model: its token embeddings, residual blocks, attention modules (in the
order the forward calls them), final norm and unembedding, found once per model by ``of(model)`` and checked on
four tokens against what the model itself reports, so a knockout, a patch or a lens that would miss a site is
refused in words instead of drawing a wrong map. Hooks on them are installed with models/core/hooks.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from models.core import capture, hooks, memo

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "SelfAttention")
PROJECTION_NAMES = ("o_proj", "c_proj", "out_proj", "dense", "o")
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "layer_norm")
# where stacks of decoder-only models live besides the base model itself: an encoder–decoder's decoder used alone
# (BartForCausalLM, OPT), a vision–language model's language model, GPT-style ``transformer``
STACK_HOLDERS = ("decoder", "language_model", "transformer", "encoder")
# the names of a stack's last norm, by the container that holds the stack (the last entry: BERT's per-block
# "layer_norm"s never qualify, which is why FINAL_NORM_NAMES[:-1] is used for base models)
STACK_NORM_NAMES = FINAL_NORM_NAMES + ("norm_f", "final_norm", "layernorm", "ln", "output_layernorm")


@dataclass(frozen=True)
class AttentionSite:
    """One attention module in forward order: the module the attention function is called for, its output
    projection (the heads' outputs enter it side by side), the residual block it sits in, and its kind."""

    module: nn.Module
    projection: nn.Module
    block: nn.Module
    kind: str  # "self" (decoder-only or encoder-only), "encoder", "decoder" or "cross"
    layer: int  # its block's index within its stack


@dataclass(frozen=True)
class Sites:
    """Where things are in one model (found once per model by ``sites``)."""

    model_class: str
    embeddings: nn.Module | None  # the input token embeddings
    layers: tuple[nn.Module, ...]  # the residual blocks of the main stack in order (an encoder–decoder's decoder)
    attention: tuple[AttentionSite, ...]  # every attention module, in the order the forward calls them
    final_norm: nn.Module | None  # the norm before the unembedding (that stack's last), if any
    unembedding: nn.Module | None  # the LM head, if any
    # what a four-token check found wrong with these sites (``_verify``): the residual stream read at them is not
    # the one the model reports, or its attention calls come from modules not listed; "" when they hold
    stream_problem: str = ""
    attention_problem: str = ""

    def of_kind(self, *kinds: str) -> list[AttentionSite]:
        if self.attention_problem:
            raise ValueError(self.attention_problem)
        return [site for site in self.attention if site.kind in kinds]

    def projections(self) -> list[nn.Module]:
        """Each layer's attention output projection of the main stack (self-attention), in layer order."""
        chosen = self.of_kind("self") or self.of_kind("decoder")
        if len(chosen) != len(self.layers):
            raise ValueError(f"{self.model_class}: could not pair each of its {len(self.layers)} layers with its "
                             "attention's output projection")
        return [site.projection for site in chosen]

    def require(self, what: str, purpose: str):
        """``getattr(self, what)``, or a ``ValueError`` saying ``purpose`` cannot find it in this architecture."""
        if what in ("layers", "final_norm") and self.stream_problem:
            raise ValueError(f"{purpose} is not available for {self.model_class}: {self.stream_problem}")
        found = getattr(self, what)
        if found is None or (isinstance(found, tuple) and not found):
            raise ValueError(f"{purpose} does not know where {self.model_class}'s {what.replace('_', ' ')} is")
        return found


_FOUND: "memo.PerObject[Sites]" = memo.PerObject()


def of(model: nn.Module) -> Sites:
    """The named sites of a transformers text model (decoder-only, BERT-style encoder, BART/Marian/Whisper-style
    encoder–decoder), found once per model and kept beside it (not on it), for the model's lifetime."""
    return _FOUND.get(model, lambda: _verify(model, _find(model)))


def _verify(model: nn.Module, found: Sites) -> Sites:
    """``_checked``, apart from whatever block asked (sites are found lazily, perhaps inside someone's hooks or
    recording): neither the hooks of an enclosing ``installed`` block nor its capture act for the check's forwards."""
    with hooks.apart(), capture.apart():
        return _checked(model, found)


def _checked(model: nn.Module, found: Sites) -> Sites:
    """The sites checked on four tokens, once per model, against what the model itself reports: the residual
    stream read at ``layers`` and ``final_norm`` must be its own ``hidden_states``, and every module its attention
    function is called for must be one of ``attention`` (else a knockout or an ablation would miss it silently).
    A check that cannot run (no text input, an encoder–decoder) leaves the sites as found."""
    config = getattr(model, "config", None)
    inputs = capture.probe_inputs(model) if config is not None else None
    if inputs is None or getattr(config, "is_encoder_decoder", False) or not found.layers:
        return found
    kind = capture.model_type(model)
    stream_problem = attention_problem = ""
    recorder = capture.Recorder.of(model)
    try:
        with torch.inference_mode(), contextlib.ExitStack() as stack:
            if capture.implementation(model) == capture.ATTENTION_NAME:
                stack.enter_context(capture.observing(model, recorder))
            slices = stack.enter_context(residual_window(model, 0, inputs["input_ids"].shape[1], _found=found)) \
                if found.final_norm is not None and found.layers else None
            output = model(**inputs, output_hidden_states=True)
    except Exception as error:  # noqa: BLE001 - a model the check cannot run: its sites stay as found

        logging.getLogger(__name__).info("site check of %s did not run: %s", kind, error)
        return found
    reported = getattr(output, "hidden_states", None)
    if reported is not None and (slices is not None or found.final_norm is None):
        theirs = [h[0].float() for h in reported]
        same = slices is not None and _same_stream([s.float() for s in slices], theirs)
        if not same:
            # the model may report its last block's output as it is: a post-norm stack (BERT, BART's decoder)
            # has no final norm, whatever module of that name sits nearby
            unnormed = dataclasses.replace(found, final_norm=nn.Identity())
            with torch.inference_mode(), residual_window(model, 0, inputs["input_ids"].shape[1],
                                                         _found=unnormed) as plain:
                model(**inputs)
            if _same_stream([s.float() for s in plain], theirs):
                found, same = unnormed, True
        if not same:
            stream_problem = (f"the residual stream read between its blocks is not the one {kind} reports as its "
                              "hidden states (its stream is not one vector per token, or its blocks are not where "
                              "this app looks), so the lens and patching would read the wrong numbers")
        elif found.unembedding is not None and getattr(output, "logits", None) is not None:
            head = _matching_head(found.unembedding, config, reported[-1], output.logits)
            if head is None:
                stream_problem = (f"{kind}'s output is not its language-model head applied to its last hidden "
                                  "state (its head does more than this app knows), so the lens would not read "
                                  "what the model reads")
            else:
                found = dataclasses.replace(found, unembedding=head)
    listed = {id(site.module) for site in found.attention}
    called = {id(m) for m in model.modules() if recorder.module_names.get(id(m)) in
              {rec.name for records in recorder.records.values() for rec in records}}
    if recorder.records and not called <= listed:
        attention_problem = (f"{kind}'s attention is computed in modules this app does not know as its layers' "
                             "attention, so ablating, knocking out or explaining a head would miss it")
    return dataclasses.replace(found, stream_problem=stream_problem, attention_problem=attention_problem)


def _first(module, names):
    return next((getattr(module, name) for name in names if isinstance(getattr(module, name, None), nn.Module)), None)


def _projection(attention: nn.Module) -> nn.Module | None:
    """An attention module's output projection (BERT keeps it beside the attention, in ``attention.output.dense``)."""
    found = _first(attention, PROJECTION_NAMES)
    if found is None and isinstance(getattr(attention, "output", None), nn.Module):
        found = _first(attention.output, PROJECTION_NAMES)
    return found


def _stack(container: nn.Module | None, count: int | None = None) -> list[nn.Module]:
    """The ModuleList of blocks in ``container`` (``layers``, ``h``, ``layer``, ``block``, ``blocks``)."""
    if container is None:
        return []
    for name in ("layers", "h", "layer", "block", "blocks"):
        found = getattr(container, name, None)
        if isinstance(found, nn.ModuleList) and (count is None or len(found) == count):
            return list(found)
    if count is not None:  # any ModuleList of the configured length
        found = next((child for child in container.children()
                      if isinstance(child, nn.ModuleList) and len(child) == count), None)
        if found is not None:
            return list(found)
    return []


def _self_attention(block: nn.Module) -> nn.Module | None:
    found = _first(block, ATTENTION_NAMES)
    if found is None:  # T5: block.layer[0].SelfAttention
        inner = getattr(block, "layer", None)
        if isinstance(inner, nn.ModuleList) and len(inner):
            found = _first(inner[0], ATTENTION_NAMES)
    return found


def _attention_site(block: nn.Module, attention: nn.Module, kind: str, layer: int) -> AttentionSite | None:
    projection = _projection(attention)
    if projection is None:
        return None
    module = attention.self if isinstance(getattr(attention, "self", None), nn.Module) else attention  # BERT
    return AttentionSite(module, projection, block, kind, layer)


def _asked(model: nn.Module, getter: str) -> nn.Module | None:
    """The module ``model.<getter>()`` names; None where the class has none or refuses to say
    (CLIP's image classifier raises NotImplementedError)."""
    try:
        return getattr(model, getter)() if hasattr(model, getter) else None
    except NotImplementedError:
        return None


def _find(model: nn.Module) -> Sites:
    config = getattr(model, "config", None)
    base = getattr(model, "base_model", model)
    embeddings = _asked(model, "get_input_embeddings")
    unembedding = _asked(model, "get_output_embeddings")
    encoder, decoder = getattr(base, "encoder", None), getattr(base, "decoder", None)
    attention: list[AttentionSite] = []
    if getattr(config, "is_encoder_decoder", False) and encoder is not None and decoder is not None:
        for index, block in enumerate(_stack(encoder)):
            own = _self_attention(block)
            if own is not None and (site := _attention_site(block, own, "encoder", index)) is not None:
                attention.append(site)
        layers = _stack(decoder)
        for index, block in enumerate(layers):
            own = _self_attention(block)
            if own is not None and (site := _attention_site(block, own, "decoder", index)) is not None:
                attention.append(site)
            cross = _first(block, ("encoder_attn", "crossattention", "cross_attn"))
            if cross is not None and (site := _attention_site(block, cross, "cross", index)) is not None:
                attention.append(site)
        final_norm = _first(decoder, FINAL_NORM_NAMES)
    else:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        count = getattr(text, "num_hidden_layers", None) or getattr(config, "num_hidden_layers", None)
        holder, layers = base, _stack(base, count)
        for name in STACK_HOLDERS:
            if layers:
                break
            holder = getattr(base, name, None)
            layers = _stack(holder, count)
        for index, block in enumerate(layers):
            own = _self_attention(block)
            if own is not None and (site := _attention_site(block, own, "self", index)) is not None:
                attention.append(site)
        # a guess the four-token check (``_verify``) confirms, or replaces by no norm at all (a post-norm stack)
        final_norm = (_first(holder, STACK_NORM_NAMES) or _first(base, STACK_NORM_NAMES)) if layers else None
        unembedding = _head(model, base) or unembedding
    return Sites(type(model).__name__, embeddings, tuple(layers), tuple(attention), final_norm, unembedding)


def _head(model: nn.Module, base: nn.Module) -> nn.Module | None:
    """The whole language-model head when it is more than the output embedding (BERT's ``cls``: a dense layer and
    a norm before it; ELECTRA's two modules): the model's children other than its base model, in order."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is None or base is model:
        return None
    head = [child for child in model.children() if child is not base]
    if not head or head == [output] or not any(output is m for child in head for m in child.modules()):
        return None
    return head[0] if len(head) == 1 else nn.Sequential(*head)


class ScaledHead(nn.Module):
    """A language-model head followed by what some models do to its logits: a scale (Cohere's ``logit_scale``)
    and a soft cap ``c · tanh(z / c)`` (Gemma 2's ``final_logit_softcapping``)."""

    def __init__(self, head: nn.Module, scale: float = 1.0, softcap: float = 0.0):
        super().__init__()
        self.head, self.scale, self.softcap = head, scale, softcap

    def forward(self, hidden):
        logits = self.head(hidden) * self.scale
        return torch.tanh(logits / self.softcap) * self.softcap if self.softcap else logits


def _matching_head(head: nn.Module, config, last_hidden, logits) -> nn.Module | None:
    """``head``, or it with the config's logit scale and soft cap, whichever gives the model's own ``logits``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    scale = float(getattr(text, "logit_scale", None) or 1.0)
    softcap = float(getattr(text, "final_logit_softcapping", None) or 0.0)
    candidates = [head] + ([ScaledHead(head, scale, softcap)] if scale != 1.0 or softcap else [])
    for candidate in candidates:
        with torch.inference_mode():
            found = candidate(last_hidden).float()
        if found.shape == logits.shape and bool(torch.allclose(
                found, logits.float(), rtol=1e-4, atol=1e-4 * (1 + float(logits.abs().max())))):
            return candidate
    return None


def _same_stream(ours: list, theirs: list) -> bool:
    return len(ours) == len(theirs) and all(
        a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5 * (1 + float(b.abs().max()))))
        for a, b in zip(ours, theirs))


@contextlib.contextmanager
def residual_window(model: nn.Module, start: int, stop: int, _found: Sites | None = None) -> Iterator[list]:
    """Positions ``start:stop`` of the residual stream as the forward inside the block computes it, nothing else
    kept, in the order transformers' ``hidden_states`` lists it: what enters the first block (the embeddings), what
    leaves every block but the last, and the final norm's output. Yields the list the forward fills (per point,
    ``(stop − start, d)``)."""
    found = _found or of(model)
    layers = found.require("layers", "reading the residual stream")
    norm = found.require("final_norm", "reading the residual stream")
    slices: list = []

    def keep(point, hidden):
        if point < len(layers):  # the last block's output is read after the final norm instead
            slices.append(hidden[0, start:stop].detach().clone())

    def normed(module, args, output):
        slices.append(hooks.hidden_of(output)[0, start:stop].detach().clone())

    if isinstance(norm, nn.Identity):  # a post-norm stack: its last block's output is the stream's last point
        with hooks.installed(hooks.stream_hooks(list(layers), keep), hooks.after(layers[-1], normed)):
            yield slices
        return
    with hooks.installed(hooks.stream_hooks(list(layers), keep), hooks.after(norm, normed)):
        yield slices
