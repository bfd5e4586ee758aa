"""Attention capture for transformers models that is proven, thread-safe and memory-aware.

transformers (v5) models call one attention function chosen by name through ``AttentionInterface``. We register our
own, ``"capture"``, which hands the work to transformers' SDPA function (so the model keeps its fast path and its
outputs are bit-for-bit those of ``attn_implementation="sdpa"``) and, while a ``recording`` is active in the calling
thread, keeps each layer's post-projection, post-RoPE queries and keys plus the mask exactly as SDPA will apply it.
Weights are recomputed on demand (``results.RecomputedAttention``): softmax(q kᵀ · scaling + mask), whole for small
inputs and as reductions at any length (``models/core/tiles.py``).

Where: q and k stay on the model's device in its dtype (``keep``; on the CPU a compact copy, float16 for long float32
runs), so a run on a GPU costs the forward plus the bytes it keeps; ``check_fits`` refuses a run whose q/k and
activations do not fit in the memory free now, before it starts. Masks are kept as rules where rules fit
(``results.DescribedMask``: causal, padding), and a position bias that depends on ``j − i`` only as one vector per
head (``results.RelativeBias``), so nothing of size queries × keys is kept for a long input.

Why not ``output_attentions=True``: under SDPA/flash kernels the weights are silently ``None``, and holding every
layer's ``(heads, N, N)`` at once is what makes long inputs impossible (2.4 GB at N = 2048 for GPT-2 small).

Thread safety: the active recorder lives in a ``ContextVar``, i.e. per thread; nothing is stored on a shared module
and no hooks are installed, so two sessions running one cached model never see each other's tensors.
"""
from __future__ import annotations

import contextlib
import contextvars
import mmap
from dataclasses import dataclass, field

import numpy as np
import torch

from models.core import hooks, memory

ATTENTION_NAME = "capture"
CAPTURE_DESCRIPTION = "AttentionInterface 'capture' (SDPA forward; weights recomputed from the layer's q, k and mask)"
CAPTURE_EAGER_DESCRIPTION = ("AttentionInterface 'capture' (the model's own eager attention for the forward, for its "
                             "{terms}; weights recomputed from the layer's q, k, mask and {terms})")

# What capture does with each keyword a model hands its attention function. A keyword that is neither here nor in
# IGNORED_KEYWORDS, given a value, refuses the run at the first attention call, before any output exists: a forward
# that silently differs from the model's own is the worst defect this project can have (DESIGN.md).
KEYWORDS = {
    "scaling": "multiplies q·k",
    "dropout": "0 in eval mode (a run in training mode is refused)",
    "is_causal": "SDPA's causal rule when no mask is given",
    "position_bias": "an additive position bias (T5's buckets and others), added to the recomputed scores",
    "softcap": "the scores capped to c·tanh(s / c) before the mask (Gemma 2): the model's eager math runs",
    "s_aux": "a learned sink logit per head in every row's denominator (gpt-oss): the model's eager math runs",
    "sinks": "as s_aux",
    "sliding_window": "already in the mask transformers builds for the layer (kept as a rule)",
    "indices": "sparse attention's top-k keys, already scattered into the mask transformers builds",
}
# keywords that change nothing about which weights the softmax gives (bookkeeping the model passes through)
IGNORED_KEYWORDS = frozenset((
    "output_attentions", "output_hidden_states", "output_router_logits", "use_cache", "position_ids",
    "cache_position", "logits_to_keep", "deterministic", "layer_idx", "past_key_values", "past_key_value",
    "return_dict", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "token_type_ids",
    "layer_head_mask", "head_mask", "query_length", "target_dtype", "kwargs", "position_embeddings",
))


class UnsupportedAttention(ValueError):
    """A model hands its attention function something capture does not know how to honour."""


EAGER_PATH = "eager"  # the implementation name of the fallback: the model's own eager attention, weights returned
EAGER_PATH_DESCRIPTION = (
    "the model's own eager attention, read with output_attentions=True: its attention does not pass through "
    "transformers' AttentionInterface, so every layer's map is held whole (N² per layer and head). Long inputs, "
    "the fused long-input reductions, edge knockout and the explanations that differentiate through attention "
    "are not available on this path")
CROSS_ATTENTION_NAMES = ("encoder_attn", "crossattention", "EncDecAttention", "cross_attn", "cross_attention")

_ACTIVE: contextvars.ContextVar["Recorder | None"] = contextvars.ContextVar("attention_recorder", default=None)
_KNOCKOUT: contextvars.ContextVar["Knockout | None"] = contextvars.ContextVar("attention_knockout", default=None)
# an attention function that replaces SDPA for this thread's calls (the explanations' differentiable eager attention)
_OVERRIDE: contextvars.ContextVar = contextvars.ContextVar("attention_override", default=None)
_registered = False


# architectures whose attention code edits the mask it is handed as eager's additive float mask, so that SDPA's
# boolean mask would come out wrong (DeepSeek-V4 concatenates its compressor's 0 / −inf block bias onto it: cast to
# bool, the compressed slots a query may see would be hidden and the others shown); they get eager's masks
ADDITIVE_MASK_TYPES = ("deepseek_v4",)


def capture_mask(**kwargs):
    """The masks transformers builds for the capture implementation: SDPA's (boolean, True = attend; None + its
    causal rule for plain causal), or eager's additive ones for ``ADDITIVE_MASK_TYPES``."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    if getattr(kwargs.get("config"), "model_type", None) in ADDITIVE_MASK_TYPES:
        return eager_mask(**kwargs)
    return sdpa_mask(**kwargs)


def register() -> None:
    """Register the capture attention function and its mask function (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, capture_attention_forward)
    # Without a registered mask function transformers builds *no* mask for an unknown implementation name
    AttentionMaskInterface.register(ATTENTION_NAME, capture_mask)
    _registered = True


def model_type(module) -> str:
    """The architecture a module belongs to, as transformers names it (``config.model_type``)."""
    config = getattr(module, "config", None)
    return str(getattr(config, "model_type", "") or type(module).__name__)


def check_keywords(module, kwargs: dict) -> None:
    """Refuse, in words, a keyword this capture cannot honour (``KEYWORDS``), or dropout during training."""
    unknown = sorted(name for name, value in kwargs.items()
                     if value is not None and name not in KEYWORDS and name not in IGNORED_KEYWORDS)
    if unknown:
        raise UnsupportedAttention(
            f"{model_type(module)} hands its attention function {', '.join(repr(n) for n in unknown)}, which this "
            "app's capture does not know how to honour, so it draws no map rather than a wrong one. The eager path "
            "(models loaded with attn_implementation='eager') may still work for it; please report the model.")
    dropout = kwargs.get("dropout") or 0.0
    if dropout and getattr(module, "training", False):
        raise UnsupportedAttention(
            f"{model_type(module)} is in training mode (attention dropout {dropout}): its weights would be random. "
            "Call model.eval() first.")


def score_terms(kwargs: dict) -> tuple[float, torch.Tensor | None]:
    """(soft cap c or 0, sink logits ``(heads,)`` or None) the model asks its softmax to apply."""
    softcap = kwargs.get("softcap")
    sink = kwargs.get("s_aux")
    if sink is None:
        sink = kwargs.get("sinks")
    if sink is not None and not isinstance(sink, torch.Tensor):
        raise UnsupportedAttention(f"attention sinks given as {type(sink).__name__}, not as a tensor per head")
    return float(softcap or 0.0), sink


def terms_in_words(softcap: float, sink) -> str:
    parts = (["soft-capped scores"] if softcap else []) + (["attention sinks"] if sink is not None else [])
    return " and ".join(parts)


def _eager_function(module):
    """The model's own eager attention (its modeling file's ``eager_attention_forward``), else transformers'."""
    import sys

    modeling = sys.modules.get(type(module).__module__)
    function = getattr(modeling, "eager_attention_forward", None)
    if function is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as function
    return function


def additive_mask(attention_mask, query: torch.Tensor, key: torch.Tensor, is_causal: bool):
    """The mask SDPA would apply (boolean, True = attend; or None with its causal rule) as the additive float mask
    eager attention adds to its scores: 0 where seen, the dtype's minimum where not."""
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        return attention_mask
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        if not (is_causal and q_len > 1):
            return None
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril()[None, None]
    else:
        allowed = attention_mask
    zeros = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    return zeros.masked_fill(~allowed, torch.finfo(query.dtype).min)


def eager_forward(module, query, key, value, attention_mask, **kwargs):
    """The layer's forward by the model's own eager math, for what SDPA cannot compute (soft caps, sinks)."""
    is_causal = kwargs.get("is_causal")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    mask = additive_mask(attention_mask, query, key, bool(is_causal))
    output, _ = _eager_function(module)(module, query, key, value, mask, **kwargs)
    return output


def capture_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """The attention function models call: SDPA for the output (the model's own eager math where SDPA cannot honour
    what it asks), and a record of q, k, mask and score terms when recording."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    check_keywords(module, kwargs)
    knockout = _KNOCKOUT.get()
    if knockout is not None:
        attention_mask = knockout.mask(module, attention_mask, query.shape[2], key.shape[2], query.device, kwargs)
    override = _OVERRIDE.get()
    if override is not None:
        return override(module, query, key, value, attention_mask, **kwargs)
    recorder = _ACTIVE.get()
    if recorder is not None:
        output = recorder.attend(module, query, key, value, attention_mask, kwargs)
        if output is not None:  # the recorder computed the weights anyway: their product with v, no second pass
            return output, None
    softcap, sink = score_terms(kwargs)
    if softcap or sink is not None:
        return eager_forward(module, query, key, value, attention_mask, **kwargs), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@contextlib.contextmanager
def apart():
    """Inside the block, this thread's attention calls are plain: no recording, override or knockout of an
    enclosing block sees them (a check the code runs on its own, such as the named sites' four-token forward)."""
    tokens = [(var, var.set(None)) for var in (_ACTIVE, _KNOCKOUT, _OVERRIDE)]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


@contextlib.contextmanager
def overriding(function):
    """Inside the block, this thread's attention calls go to ``function(module, query, key, value, attention_mask,
    **kwargs) -> (output (B, q, H, d), weights)`` instead of SDPA; other threads are untouched (a ContextVar)."""
    register()
    token = _OVERRIDE.set(function)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


@dataclass
class Knockout:
    """Per-call attention knockout (Geva et al. 2023): batch row ``b`` cannot attend along the edges
    ``blocked[b]`` (bool ``(q, k)``, True = cut) in the layers where ``layers[b]`` (bool ``(layers,)``) is True.
    ``layer_of`` maps ``id(attention module)`` to its layer index."""

    layer_of: dict[int, int]
    blocked: torch.Tensor  # bool (B, q, k)
    layers: torch.Tensor  # bool (B, layers)
    _built: dict = field(default_factory=dict)  # layer -> mask, kept alive for the call (the recorder keys by id)

    def mask(self, module, attention_mask, q_len: int, k_len: int, device, kwargs):
        """``attention_mask`` with this layer's cut edges removed, in the form SDPA takes (bool, True = attend, or
        additive float); unchanged for a layer where no row cuts anything."""
        layer = self.layer_of.get(id(module))
        if layer is None or not bool(self.layers[:, layer].any()):
            return attention_mask
        if layer in self._built:
            return self._built[layer]
        if self.blocked.shape[1:] != (q_len, k_len):
            raise ValueError(f"the knockout was given for {tuple(self.blocked.shape[1:])} query × key edges, but "
                             f"layer {layer} attends {q_len} queries to {k_len} keys")
        cut = (self.blocked & self.layers[:, layer, None, None]).to(device)[:, None]  # (B, 1, q, k)
        if attention_mask is None:  # SDPA's implicit mask: causal (top-left aligned) or none
            is_causal = kwargs.get("is_causal")
            is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
            if q_len > 1 and is_causal:
                allowed = torch.tril(allowed)
            built = allowed & ~cut
        elif attention_mask.dtype == torch.bool:
            built = attention_mask[..., -k_len:] & ~cut
        else:
            built = attention_mask[..., -k_len:].masked_fill(cut, torch.finfo(attention_mask.dtype).min)
        if built.dtype == torch.bool and not bool(built.any(-1).all()):
            raise ValueError(f"the knockout leaves a query of layer {layer} no key to attend to: keep at least one "
                             "key (the first token, or the query itself) open for every query")
        self._built[layer] = built
        return built


@contextlib.contextmanager
def knocked_out(layer_of: dict[int, int], blocked: torch.Tensor, layers: torch.Tensor):
    """Attention calls in this thread inside the ``with`` block run with the edges cut (``Knockout``). The model is
    not touched: the cut lives in a ``ContextVar``, so other sessions running the same model see nothing of it."""
    register()
    token = _KNOCKOUT.set(Knockout(layer_of, blocked.bool(), layers.bool()))
    try:
        yield
    finally:
        _KNOCKOUT.reset(token)


@dataclass
class LayerRecord:
    """One attention call: ``query (B, H, q, d)`` and ``key (B, H_kv, k, d)`` as kept (``keep``: where the model
    runs, in its dtype; on the CPU a compact float32 copy, float16 beyond ``HALF_PRECISION_TOKENS`` keys), its mask
    and its bias."""

    name: str
    query: torch.Tensor
    key: torch.Tensor
    scaling: float
    # the mask: one DescribedMask per batch item (or one for all), or bool (B or 1, q, k) on the model's device
    allowed: tuple | torch.Tensor
    # an additive bias: RelativeBias values (B or 1, H or 1, q + k − 1), or (B or 1, H or 1, q, k); or None
    bias: torch.Tensor | None
    relative: bool = False  # ``bias`` holds relative-bias vectors
    softcap: float = 0.0  # scores capped to c·tanh(s / c) before the bias (0: none)
    sink: torch.Tensor | None = None  # (H,) float32 sink logits on the model's device
    number: int | None = None  # the model's own layer number (``module.layer_idx``), when it says
    window: int = 0  # the sliding window the model says this layer attends within (0: none, a global layer)


@dataclass
class Recorder:
    """Per-call state: which module is which layer, and what each layer saw."""

    module_names: dict[int, str]
    encoder_decoder: bool = False  # only then do "encoder." / "decoder." names mean different kinds
    model_type: str = "this model"  # named in refusals
    records: dict[str, list[LayerRecord]] = field(default_factory=dict)
    # an implicit mask's shape -> (allowed, bias); a mask tensor's (id, k_len) -> (the mask, (allowed, bias)): the
    # entry holds the mask, so its id cannot pass to another mask (a generation's next, wider one) while cached
    _mask_cache: dict = field(default_factory=dict)
    # per module, weak references to the last call's q and k: a second call with the very same tensors (DiffLlama
    # runs one softmax twice, over two halves of v) is the same map, not another layer
    _last_call: dict = field(default_factory=dict)
    repeated: dict = field(default_factory=dict)  # module name -> calls that repeated the same q and k
    stored: dict = field(default_factory=dict)  # the eager path: kind -> [(layer number, (B, H, q, k) float32)]
    rejected: int = 0  # maps the eager path returned that were no softmax weights (left out)

    @classmethod
    def of(cls, model: torch.nn.Module) -> "Recorder":
        """A recorder for ``model``'s calls: its module names, whether it is an encoder–decoder, its architecture."""
        return cls(module_names={id(m): name for name, m in model.named_modules()},
                   encoder_decoder=bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False)),
                   model_type=model_type(model))

    def kind_of(self, module, name: str) -> str:
        if getattr(module, "is_cross_attention", False) or any(part in name for part in CROSS_ATTENTION_NAMES):
            return "cross"
        if not self.encoder_decoder:
            return "self"
        if name.startswith("encoder.") or ".encoder." in name:
            return "encoder"
        if name.startswith("decoder.") or ".decoder." in name:
            return "decoder"
        return "self"

    def keep_eager(self, output) -> None:
        """Read a forward's returned maps (the eager path): ``attentions`` (or an encoder–decoder's
        ``encoder_attentions``, ``decoder_attentions``, ``cross_attentions``), one entry per layer; entries that
        are no softmax map (a linear-attention layer's state, None) are left out, their layer numbers kept."""
        fields = (("encoder_attentions", "encoder"), ("decoder_attentions", "decoder"),
                  ("cross_attentions", "cross")) if self.encoder_decoder else (("attentions", "self"),)
        for name, kind in fields:
            maps = getattr(output, name, None)
            if not maps:
                continue
            if kind == "encoder" and self.model_type in BLOCKED:  # LongT5's local blocks
                hidden = getattr(output, "encoder_last_hidden_state", None)
                length = 0 if hidden is None else hidden.shape[1]
                maps = [_unblock(w, length) if isinstance(w, torch.Tensor) and w.dim() == 5 else w
                        for w in maps]
            maps = [(n, w) for n, w in enumerate(maps) if isinstance(w, torch.Tensor) and w.dim() == 4]
            if kind != "cross" and self.model_type in BANDED:  # Longformer's sliding window, row by row
                maps = [(n, _unband(w)) if w.shape[-1] != w.shape[-2] else (n, w) for n, w in maps]
            if self.model_type in SCORES_RETURNED:  # its weights are exactly the softmax of what it returns
                maps = [(n, torch.softmax(w.float(), dim=-1)) for n, w in maps]
            kept = [(number, weights.detach().float().cpu().numpy()) for number, weights in maps
                    if _is_softmax(weights) and (kind == "cross" or weights.shape[-1] == weights.shape[-2])]
            self.rejected += len(maps) - len(kept)
            if kept:
                self.stored.setdefault(kind, []).extend(kept)

    def attend(self, module, query, key, value, attention_mask, kwargs) -> torch.Tensor | None:
        """Record the call; return the attention output ``(B, q, H, d)`` if this recorder computed it from the
        weights it made anyway (corpus statistics on a CPU), or None: SDPA computes it."""
        self.record(module, query, key, attention_mask, kwargs)
        return None

    def record(self, module, query, key, attention_mask, kwargs) -> None:
        name = self.module_names.get(id(module), f"<unnamed {type(module).__name__}>")
        if self._repeats(module, query, key):
            self.repeated[name] = self.repeated.get(name, 0) + 1
            return
        kind = self.kind_of(module, name)
        q_len, k_len = query.shape[2], key.shape[2]
        scaling = kwargs.get("scaling")
        scaling = float(scaling) if scaling is not None else 1.0 / float(query.shape[-1]) ** 0.5
        allowed, bias = self._described(module, attention_mask, kwargs, q_len, k_len)
        position_bias = kwargs.get("position_bias")
        if position_bias is not None:  # T5-style relative bias, added to the scores by SDPA
            position_bias = position_bias[..., -k_len:].detach().float()
            bias = position_bias if bias is None else bias.to(position_bias.device) + position_bias
        relative = None if bias is None else _relative(bias)
        softcap, sink = score_terms(kwargs)
        number = getattr(module, "layer_idx", None)
        window = kwargs.get("sliding_window")  # a label only: the mask transformers built already applies it
        self.records.setdefault(kind, []).append(LayerRecord(
            name, keep(query, k_len), keep(key, k_len), scaling, allowed,
            relative if relative is not None else bias, relative is not None, softcap,
            None if sink is None else sink.detach().float().reshape(-1), number if isinstance(number, int) else None,
            int(window) if isinstance(window, int) and window > 0 else 0))

    def _repeats(self, module, query, key) -> bool:
        """Whether this call hands the same q and k objects as the module's previous call (one map twice)."""
        import weakref

        last = self._last_call.get(id(module))
        self._last_call[id(module)] = (weakref.ref(query), weakref.ref(key))
        return last is not None and last[0]() is query and last[1]() is key

    def _described(self, module, attention_mask, kwargs, q_len: int, k_len: int):
        """The mask as rules where rules fit (SDPA's implicit causal mask, padding ranges), else as SDPA's boolean
        tensor, and any additive bias the mask carries: (allowed, bias or None), cached per mask."""
        from models.core.results import CausalMask, DescribedMask

        if attention_mask is None:
            is_causal = kwargs.get("is_causal")
            is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            shape_key = ("described", q_len, k_len, bool(q_len > 1 and is_causal))
            if shape_key not in self._mask_cache:  # one per shape, shared by the layers (and by its id)
                # SDPA's is_causal aligns top-left: query i sees keys 0..i
                rules = CausalMask(q_len, k_len) if shape_key[-1] else DescribedMask(q_len, k_len)
                self._mask_cache[shape_key] = ((rules,), None)
            return self._mask_cache[shape_key]
        key_ = ("described", id(attention_mask), k_len)
        cached = self._mask_cache.get(key_)
        if cached is not None and cached[0] is attention_mask:
            return cached[1]
        mask = attention_mask.detach()[..., -k_len:]
        if mask.dtype == torch.bool:
            allowed, bias = (mask[:, 0] if mask.ndim == 4 else mask), None
        else:  # additive float mask: very negative = blocked, anything else a bias SDPA adds
            blocked = mask <= torch.finfo(mask.dtype).min / 2
            bias = torch.where(blocked, torch.zeros((), dtype=mask.dtype, device=mask.device), mask).float()
            allowed = ~blocked
            allowed = allowed[:, 0] if allowed.ndim == 4 else allowed
            bias = bias if bool(bias.abs().max() > 0) else None
        items = [describe_mask(item) for item in allowed]
        result = (tuple(items) if all(item is not None for item in items) else allowed, bias)
        self._mask_cache[key_] = (attention_mask, result)
        return result

    def _mask(self, module, attention_mask, kwargs, q_len: int, k_len: int, lazy: bool = False):
        """The mask exactly as ``sdpa_attention_forward`` applies it, as (allowed bool ``(B or 1, q, k)`` on the
        CPU, additive float32 bias or None): what a ``Recorder`` subclass that reduces each call at once reads
        (corpus statistics). ``lazy``: SDPA's implicit causal mask as a ``results.CausalMask`` (its shape)."""
        if attention_mask is None:
            is_causal = kwargs.get("is_causal")
            is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            shape_key = ("implicit", q_len, k_len, bool(q_len > 1 and is_causal), lazy)
            if shape_key in self._mask_cache:  # one (q, k) mask shared by every layer, not one per layer
                return self._mask_cache[shape_key]
            if q_len > 1 and is_causal:
                from models.core.results import CausalMask

                causal = CausalMask(q_len, k_len)
                allowed = causal if lazy else torch.from_numpy(causal.array())[None]
            else:
                allowed = torch.ones(1, q_len, k_len, dtype=torch.bool)
            self._mask_cache[shape_key] = (allowed, None)
            return self._mask_cache[shape_key]
        cached = self._mask_cache.get(("tensor", id(attention_mask), k_len, lazy))
        if cached is not None and cached[0] is attention_mask:
            return cached[1]
        mask = attention_mask.detach().to("cpu")[..., -k_len:]
        if mask.dtype == torch.bool:
            result = (mask[:, 0] if mask.ndim == 4 else mask, None)
        else:  # additive float mask: very negative = blocked, anything else a bias SDPA adds
            blocked = mask <= torch.finfo(mask.dtype).min / 2
            bias = torch.where(blocked, torch.zeros((), dtype=mask.dtype), mask).to(torch.float32)
            allowed = ~blocked
            result = (allowed[:, 0] if allowed.ndim == 4 else allowed, bias if bias.abs().max() > 0 else None)
        self._mask_cache[("tensor", id(attention_mask), k_len, lazy)] = (attention_mask, result)
        return result

    # --- turning records into results ---------------------------------------------------------------------------

    def kinds(self) -> list[str]:
        return list(self.records) + [kind for kind in self.stored if kind not in self.records]

    def _stored_maps(self, kind: str, batch_index: int, query_positions, key_positions, query_tokens, key_tokens):
        from models.core.results import StoredAttention

        layers = self.stored[kind]
        q_len, k_len = layers[0][1].shape[2:]
        shapes = sorted({tuple(weights.shape[2:]) for _, weights in layers})
        if len(shapes) > 1:
            raise ValueError(f"{self.model_type}'s layers return maps of different shapes for one input "
                             f"({', '.join(f'{q} × {k}' for q, k in shapes)}): some attend to compressed blocks of "
                             "tokens rather than to tokens, and no map here can label such keys, so none is drawn.")
        q_index = slice(None) if query_positions is None else np.asarray(query_positions)
        k_index = slice(None) if key_positions is None else np.asarray(key_positions)

        def item(weights: np.ndarray) -> np.ndarray:  # a view when every position is kept: no copy of N² per layer
            chosen = weights[batch_index if len(weights) > 1 else 0]
            return chosen[:, q_index][:, :, k_index] if query_positions is not None or key_positions is not None \
                else chosen

        maps = [item(weights) for _, weights in layers]
        q_len = maps[0].shape[1]
        k_len = maps[0].shape[2]
        return StoredAttention(
            kind=kind,
            query_tokens=list(query_tokens) if query_tokens is not None else [str(i) for i in range(q_len)],
            key_tokens=list(key_tokens) if key_tokens is not None else [str(i) for i in range(k_len)],
            layers=maps, layer_numbers=tuple(number for number, _ in layers))

    def attention_maps(self, kind: str, batch_index: int = 0, query_positions=None, key_positions=None,
                       query_tokens: list[str] | None = None, key_tokens: list[str] | None = None):
        """``RecomputedAttention`` for one item of the batch, restricted to the given positions (e.g. no padding).

        ``query_positions``/``key_positions``: index arrays into the sequence (default: all). The maps share the
        recorded tensors' memory (views, on the model's device) when every position is kept.
        """
        from models.core.results import RecomputedAttention, RelativeBias

        if kind not in self.records and kind in self.stored:
            return self._stored_maps(kind, batch_index, query_positions, key_positions, query_tokens, key_tokens)
        if kind not in self.records:
            if not self.kinds():
                raise ValueError(f"{self.model_type} gave no attention map at all: its layers do not compute a "
                                 "softmax attention this app can read (a recurrent or state-space model), or they "
                                 "compute it in a way that passes neither through transformers' AttentionInterface "
                                 "nor through output_attentions.")
            raise ValueError(f"This view needs {self.model_type}'s {kind} attention, and its run gave "
                             f"{', '.join(self.kinds())}: its modules are not named the way this app tells encoder, "
                             "decoder and cross-attention apart (encoder., decoder., encoder_attn), or that part "
                             "computes attention its own way.")
        layers = self.records[kind]
        q_len, k_len = layers[0].query.shape[2], layers[0].key.shape[2]
        key_counts = sorted({int(rec.key.shape[2]) for rec in layers if rec.query.shape[2] == q_len})
        if len(key_counts) > 1:
            raise ValueError(
                f"{self.model_type}'s layers attend the same {q_len} queries to different numbers of keys "
                f"({', '.join(map(str, key_counts))}): some attend to compressed blocks of tokens rather than to "
                "tokens, and no map here can label such keys, so none is drawn.")
        q_pos = _positions(query_positions, q_len)
        k_pos = _positions(key_positions, k_len)
        queries, keys, scalings, masks, mask_index, biases = [], [], [], [], [], []
        mask_ids: dict[int, int] = {}
        numbers = [rec.number for rec in layers]
        if any(n is None for n in numbers) or len(set(numbers)) != len(numbers):
            numbers = list(range(len(layers)))  # the model does not say: counted in call order
        for rec in layers:
            queries.append(_select(_item(rec.query, batch_index), 1, q_pos))
            keys.append(_select(_item(rec.key, batch_index), 1, k_pos))
            scalings.append(rec.scaling)
            if id(rec.allowed) not in mask_ids:
                mask_ids[id(rec.allowed)] = len(masks)
                masks.append(_mask_item(rec.allowed, batch_index, q_pos, k_pos, q_len, k_len))
            mask_index.append(mask_ids[id(rec.allowed)])
            if rec.bias is None:
                biases.append(None)
            elif rec.relative:
                relative = _relative_item(_item(rec.bias, batch_index), q_pos, k_pos, q_len, k_len)
                biases.append(RelativeBias(relative) if relative is not None else
                              _dense_relative(_item(rec.bias, batch_index), q_len, k_len)[:, _index(q_pos)][
                                  :, :, _index(k_pos)])
            else:
                bias = _item(rec.bias, batch_index)  # (H or 1, q, k)
                biases.append(bias[:, _index(q_pos)][:, :, _index(k_pos)].contiguous())
        n_q, n_k = _count(q_pos, q_len), _count(k_pos, k_len)
        return RecomputedAttention(
            kind=kind,
            query_tokens=list(query_tokens) if query_tokens is not None else [str(i) for i in range(n_q)],
            key_tokens=list(key_tokens) if key_tokens is not None else [str(i) for i in range(n_k)],
            queries=queries, keys=keys, scalings=scalings, allowed_masks=masks, mask_index=mask_index,
            biases=biases if any(b is not None for b in biases) else [],
            softcaps=[rec.softcap for rec in layers] if any(rec.softcap for rec in layers) else [],
            sinks=[rec.sink for rec in layers] if any(rec.sink is not None for rec in layers) else [],
            layer_numbers=tuple(numbers),
            windows=tuple(rec.window for rec in layers) if any(rec.window for rec in layers) else (),
        )


def describe_mask(allowed: torch.Tensor):
    """A ``results.DescribedMask`` equal to the boolean ``(q, k)`` mask ``allowed`` (causal or not, with an offset,
    over a range of real keys: what padding and SDPA's masks make), or None when no rules fit (it stays an array)."""
    from models.core.results import CausalMask, DescribedMask

    q_len, k_len = allowed.shape
    seen_keys = torch.nonzero(allowed.any(0)).flatten()
    if len(seen_keys) == 0:
        return None
    start, stop = int(seen_keys[0]), int(seen_keys[-1]) + 1
    candidates = [DescribedMask(q_len, k_len, False, start, stop)]
    if q_len > 1:
        first_row = torch.nonzero(allowed[0]).flatten()
        offsets = {0, k_len - q_len} | ({int(first_row[-1])} if len(first_row) else set())
        candidates += [CausalMask(q_len, k_len, key_start=start, key_stop=stop, offset=offset)
                       for offset in sorted(offsets)]
        # a sliding window (Mistral, Gemma's local layers): the last row sees the window's width of keys
        last_row = torch.nonzero(allowed[-1]).flatten()
        if len(last_row) and int(last_row[0]) > start:
            width = int(last_row[-1]) - int(last_row[0]) + 1
            candidates += [CausalMask(q_len, k_len, key_start=start, key_stop=stop, offset=offset, window=width)
                           for offset in sorted(offsets)]
    cols = torch.arange(k_len, device=allowed.device)[None, :]
    rows = torch.arange(q_len, device=allowed.device)[:, None]
    for candidate in candidates:
        rule = (cols >= candidate.key_start) & (cols < candidate.key_stop)
        if candidate.causal:
            rule = rule & (cols - rows <= candidate.offset)
        if candidate.window:
            rule = rule & (cols - rows > candidate.offset - candidate.window)
        if bool(torch.equal(rule.expand(q_len, k_len), allowed.bool())):
            return candidate
    return None


def _relative(bias: torch.Tensor) -> torch.Tensor | None:
    """The vectors ``(B or 1, H or 1, q + k − 1)`` of a ``(B or 1, H or 1, q, k)`` bias that depends on ``j − i``
    only (T5's relative buckets, ALiBi), read off its first row and column; None when it depends on more."""
    q_len, k_len = bias.shape[-2:]
    values = torch.cat([bias[..., :, 0].flip(-1), bias[..., 0, 1:]], dim=-1)  # index j − i + q − 1
    if not torch.equal(_dense_relative(values, q_len, k_len), bias):
        return None
    return values


def _dense_relative(values: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    index = (torch.arange(k_len, device=values.device)[None, :] - torch.arange(q_len, device=values.device)[:, None]
             + q_len - 1)
    return values[..., index]


def _relative_item(values: torch.Tensor, q_pos, k_pos, q_len: int, k_len: int) -> torch.Tensor | None:
    """Relative-bias vectors ``(H or 1, q' + k' − 1)`` for contiguous position ranges; None for other selections."""
    if not (isinstance(q_pos, range) and isinstance(k_pos, range)):
        return None
    n_q, n_k = len(q_pos), len(k_pos)
    # new index t = j' − i' + n_q − 1 reads the old index (k0 + j') − (q0 + i') + q_len − 1
    first = k_pos.start - q_pos.start + q_len - 1 - (n_q - 1)
    return values[..., first:first + n_q + n_k - 1].contiguous()


def _positions(positions, length: int):
    """A ``range`` for all positions or a contiguous run (views, no copies), else an index tensor."""
    if positions is None:
        return range(length)
    index = torch.as_tensor(positions, dtype=torch.int64).flatten()
    if len(index) and bool((torch.diff(index) == 1).all()):
        return range(int(index[0]), int(index[-1]) + 1)
    return index


def _index(positions):
    return slice(positions.start, positions.stop) if isinstance(positions, range) else positions


def _count(positions, length: int) -> int:
    return len(positions)


def _select(tensor: torch.Tensor, dim: int, positions) -> torch.Tensor:
    """``tensor`` at ``positions`` along ``dim``: a view for a range, a copy for an index."""
    if isinstance(positions, range):
        if positions.start == 0 and positions.stop == tensor.shape[dim]:
            return tensor
        return tensor.narrow(dim, positions.start, len(positions))
    return tensor.index_select(dim, positions.to(tensor.device))


OWN_MAPPING_BYTES = 1 << 20  # copies at least this large get their own memory mapping (see _compact_copy)
# Beyond this many keys q and k are kept in float16 (half the bytes: SmolLM2 at 8,192 tokens keeps 377 MB instead of
# 755 MB); every view still recomputes its head's weights in float32 from them (results.attention_probabilities).
# Up to it they stay float32, so the maps of ordinary inputs equal the eager model's to float32 rounding.
HALF_PRECISION_TOKENS = 4096
HALF_LIMIT = 60000.0  # float16's largest finite value is 65,504: larger q/k values stay float32


def _fits_half(tensor: torch.Tensor) -> bool:
    """True when every value of a float tensor is within float16's range (and the model is not already bf16,
    whose range float16 lacks)."""
    if tensor.dtype == torch.bfloat16:
        return False
    return bool(tensor.detach().abs().amax() < HALF_LIMIT)


def keep(tensor: torch.Tensor, keys: int) -> torch.Tensor:
    """What capture keeps of q or k ``(B, H, n, d)`` of a call over ``keys`` keys.

    On a GPU (or MPS): the tensor itself, on the model's device in the model's dtype, with no copy to the host (at
    131,072 tokens 32 synchronous host copies were 76–84% of a run); copied on the device only when it is a view
    into something larger that must not stay alive (GPT-2's fused q|k|v, a cache). On the CPU: a compact copy
    (``_compact_copy``) in the model's dtype, float32 models beyond ``HALF_PRECISION_TOKENS`` keys in float16 when
    the values fit (half the host memory)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size():
            return tensor.clone(memory_format=torch.contiguous_format)
        return tensor
    if tensor.dtype != torch.float32:
        return _compact_copy(tensor, tensor.dtype)
    half = keys > HALF_PRECISION_TOKENS and _fits_half(tensor)
    return _compact_copy(tensor, torch.float16 if half else torch.float32)


def _compact_copy(tensor: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A contiguous CPU copy of ``(B, H, n, d)`` q or k in ``dtype``.

    Always a copy: GPT-2's q and k are strided views into the fused ``c_attn`` output, so keeping the view would keep
    q, k *and* v of every layer alive (1.5× the memory), and a static KV cache is overwritten in place later.
    A large copy lives in its own anonymous mapping, not in the malloc heap: kept copies interleaved with the
    forward's short-lived activations pinned the freed heap (glibc cannot give back memory below a live block), which
    cost 150 MB of extra peak RSS at 2,048 tokens on GPT-2 small; the mapping is returned to the OS when freed.
    """
    tensor = tensor.detach()
    nbytes = tensor.numel() * dtype.itemsize
    if nbytes < OWN_MAPPING_BYTES:
        return tensor.to("cpu", dtype, memory_format=torch.contiguous_format, copy=True)
    # the tensor holds a reference to the mapping, so it lives exactly as long as the copy (torch.frombuffer)
    out = torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(tensor.shape)
    return out.copy_(tensor)


def _mask_item(allowed, index: int, q_pos, k_pos, q_len: int, k_len: int):
    """One batch item's mask at the given positions: rules stay rules over contiguous ranges (shifted), an array is
    sliced (on the model's device)."""
    if isinstance(allowed, tuple):  # DescribedMask per batch item, or one for all
        rules = allowed[index if len(allowed) > 1 else 0]
        if isinstance(q_pos, range) and isinstance(k_pos, range):
            return rules.shifted((q_pos.start, q_pos.stop), (k_pos.start, k_pos.stop))
        allowed = torch.from_numpy(rules.array())[None]
    return _item(allowed, index)[_index(q_pos)][:, _index(k_pos)].contiguous()


# --- what a run keeps, before it runs ---------------------------------------------------------------------------------

def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _first(config, *names, default=0):
    return next((int(getattr(config, n)) for n in names if getattr(config, n, None)), default)


def kept_bytes_per_token(config, device: str, dtype: torch.dtype, tokens: int) -> int:
    """Bytes capture keeps per token of a decoder's self-attention: every layer's q and k, ``layers × (heads +
    kv_heads) × head_dim`` values in the dtype ``keep`` uses on ``device``."""
    text = _text_config(config)
    layers = _first(text, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(text, "num_attention_heads", "n_head", "num_heads")
    kv_heads = _first(text, "num_key_value_heads", default=heads)
    head_dim = _first(text, "head_dim", default=_first(text, "hidden_size", "n_embd", "d_model") // max(1, heads))
    if device.startswith("cpu") and dtype == torch.float32:
        itemsize = 2 if tokens > HALF_PRECISION_TOKENS else 4
    else:
        itemsize = torch.empty((), dtype=dtype).element_size()
    return layers * (heads + kv_heads) * head_dim * itemsize


def working_bytes_per_token(config, dtype: torch.dtype) -> int:
    """A bound on the forward's own activations per token while it runs (SDPA keeps no N × N): the residual stream
    and its temporaries (8 × hidden) and the MLP's gate, up and activation (3 × intermediate)."""
    text = _text_config(config)
    hidden = _first(text, "hidden_size", "n_embd", "d_model")
    intermediate = _first(text, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    return (8 * hidden + 3 * intermediate) * torch.empty((), dtype=dtype).element_size()


class DoesNotFit(ValueError):
    """A run refused before it started because its q/k and activations do not fit in the memory free now (a cache
    holding earlier runs on the same device may drop some and try again)."""


def check_fits(model: torch.nn.Module, tokens: int, device: str, dtype: torch.dtype) -> None:
    """Refuse, before the forward, a run whose kept q/k and activations do not fit in the memory free on ``device``
    now, with how many tokens would (a ``ValueError`` the page shows; the server keeps serving)."""
    from models.core import memory_fit

    config = getattr(model, "config", None)
    if config is None:
        return
    kept = kept_bytes_per_token(config, device, dtype, tokens)
    if on_eager_path(model):  # whole maps instead of q and k: every layer's (heads, N, N), in float32 on the host
        text = _text_config(config)
        heads = _first(text, "num_attention_heads", "n_head", "num_heads")
        kept = _first(text, "num_hidden_layers", "n_layer", "num_layers") * heads * tokens * 4 * 2
    per_token = kept + working_bytes_per_token(config, dtype)
    free = memory_fit.free_for_tensors(device)
    if free is None or not per_token:
        return
    budget = free * memory_fit.RUN_SHARE
    if tokens * per_token > budget:
        from models.core import limits

        fit = limits.tokens_that_fit(free, per_token, memory_fit.RUN_SHARE)
        what = "whole attention maps (its eager path)" if on_eager_path(model) else "queries and keys"
        raise DoesNotFit(
            f"A {tokens:,}-token input keeps {tokens * kept / 2**30:,.1f} GB of {what} on {device} (and "
            f"needs about {tokens * (per_token - kept) / 2**30:,.1f} GB more while the model runs), and {device} has "
            f"{max(free, 0) / 2**30:,.1f} GB free now: about {fit:,} tokens fit. Lower the token limit in the "
            "sidebar (or free memory on the device); everything else keeps working.")


def _item(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Batch item ``index`` of a tensor whose batch dimension may be broadcast (size 1)."""
    return tensor[index if tensor.shape[0] > 1 else 0]


@contextlib.contextmanager
def recording(model: torch.nn.Module):
    """Record every attention call of ``model`` made in this thread inside the ``with`` block.

    The model must have been loaded with ``attn_implementation="capture"``; anything else would silently record
    nothing, so it is refused.
    """
    recorder = Recorder.of(model)
    with observing(model, recorder):
        yield recorder


def implementation(model) -> str | None:
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def on_eager_path(model) -> bool:
    """Whether ``model``'s maps come from its own eager attention (``EAGER_PATH_DESCRIPTION``), not the capture."""
    return implementation(model) == EAGER_PATH


def require_interface(model, what: str) -> None:
    """Refuse, in words, work that needs the capture function on a model drawn by the eager path."""
    if on_eager_path(model):
        raise ValueError(f"{what} needs the model's attention to pass through transformers' AttentionInterface, "
                         f"and {model_type(model)} computes its own: its maps are drawn from its eager attention "
                         "(the page says so), which cannot be changed per call. The other tabs work.")


@contextlib.contextmanager
def observing(model: torch.nn.Module, recorder: Recorder):
    """Hand every attention call of ``model`` in this thread to ``recorder.record`` inside the ``with`` block: a
    ``Recorder`` subclass may reduce each layer at once instead of keeping its q and k (corpus statistics do).

    A model on the eager path (its attention does not pass through the interface) instead returns its maps: the
    calls of ``model`` in the block are asked for them (``output_attentions=True``, this call only) and its
    outputs read (``Recorder.keep_eager``)."""
    register()
    if on_eager_path(model):
        if type(recorder).record is not Recorder.record:
            raise ValueError(f"{model_type(model)} draws its maps on the eager path, which gives whole maps, not "
                             "the queries and keys this reduction reads; corpus statistics need the capture path")
        with _eager_maps(model, recorder):
            yield recorder
        return
    if implementation(model) != ATTENTION_NAME:
        raise ValueError(f"this model runs attention with {implementation(model)!r}; load it with "
                         f"attn_implementation={ATTENTION_NAME!r} (models.core.loading does) to capture attention")
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
        memory.release_freed_heap()  # the forward's activations, freed but pinned in the heap (models/core/memory.py)


@contextlib.contextmanager
def _eager_maps(model: torch.nn.Module, recorder: Recorder):
    def ask(module, args, kwargs):
        return args, {**kwargs, "output_attentions": True}

    def keep(module, args, kwargs, output):
        recorder.keep_eager(output)

    with hooks.installed(hooks.before(model, ask, with_kwargs=True), hooks.after(model, keep, with_kwargs=True)):
        yield recorder


@dataclass(frozen=True)
class Probe:
    """What a four-token run showed about a model's attention, before any user input runs."""

    recorded: bool  # some layer's map was captured (by the interface, or returned on the eager path)
    softcap: bool = False
    sinks: bool = False
    error: str = ""  # the probe's run failed (then ``recorded`` is False): what it said
    rejected: bool = False  # the eager path returned (B, H, q, k) "attentions" that are not softmax weights
    # a language model whose captured self-attention let a token see later ones: its SDPA path skipped the
    # causal mask on the word of a module flag that is wrong (BigBird-Pegasus's decoder), so its own eager
    # path, which builds the mask, is the one to trust
    not_causal: bool = False

    def description(self) -> str:
        """How this model's maps are drawn, in words (``LoadedModel.capture``)."""
        terms = terms_in_words(self.softcap, True if self.sinks else None)
        return CAPTURE_EAGER_DESCRIPTION.format(terms=terms) if terms else CAPTURE_DESCRIPTION


def probe_inputs(model) -> dict | None:
    """Four tokens for a text model (and two decoder tokens for an encoder–decoder); None for other inputs."""
    if getattr(model, "main_input_name", "input_ids") != "input_ids":
        return None
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = int(getattr(text, "vocab_size", 0) or getattr(config, "vocab_size", 0) or 8)
    device = next(model.parameters()).device
    ids = (torch.arange(1, 5, device=device) % vocab)[None]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(config, "is_encoder_decoder", False):
        start = next((v for v in (getattr(config, "decoder_start_token_id", None), getattr(config, "pad_token_id", None))
                      if isinstance(v, int)), 0)
        inputs["decoder_input_ids"] = torch.full((1, 2), start, device=device)
    return inputs


def probe(model, inputs: dict | None = None) -> Probe | None:
    """Run four tokens (or ``inputs``: a vision family's small image) through ``model`` and say what its attention
    does: a keyword capture cannot honour raises ``UnsupportedAttention`` (the load is refused in words); None for a
    model that reads other inputs than text and was given none (then the first real run decides)."""
    inputs = probe_inputs(model) if inputs is None else inputs
    if inputs is None:
        return None
    recorder = Recorder.of(model)
    try:
        with torch.inference_mode(), observing(model, recorder):
            model(**inputs)
    except UnsupportedAttention:
        raise
    except Exception as error:  # noqa: BLE001 - the probe is advice; the real run reports its own errors
        import logging

        logging.getLogger(__name__).info("attention probe of %s did not run: %s", model_type(model), error)
        return Probe(False, error=f"{type(error).__name__}: {error}")
    layers = [record for kind in recorder.records.values() for record in kind]
    stored = any(recorder.stored.values())
    if recorder.encoder_decoder and layers and not {"encoder", "decoder", "cross"} <= set(recorder.records):
        layers = []  # part of it computes attention its own way (BigBird-Pegasus's encoder): the eager path
    # a decoder's self-attention must not see later tokens (a language model's, an encoder–decoder's decoder's)
    language_model = type(model).__name__.endswith("ForCausalLM")
    decoding = recorder.records.get("decoder", ()) if recorder.encoder_decoder else \
        recorder.records.get("self", ()) if language_model else ()
    not_causal = any(_sees_later(record.allowed) for record in decoding
                     if record.query.shape[2] == record.key.shape[2])
    return Probe(bool(layers) or stored, any(r.softcap for r in layers),
                 any(r.sink is not None for r in layers), rejected=recorder.rejected > 0 and not stored,
                 not_causal=not_causal)


def _sees_later(allowed) -> bool:
    """Whether a recorded mask lets some query see a key after it (rules or a boolean array)."""
    if isinstance(allowed, tuple):
        return any(not rules.causal for rules in allowed)
    return bool(torch.triu(allowed.bool(), diagonal=1).any())


def notices(model, maps) -> tuple[str, ...]:
    """What a page should say about how ``maps`` were drawn: the eager path and what it cannot do, and a hybrid's
    layers that have no softmax map (named by the config's layer types where it lists them)."""
    said = []
    if on_eager_path(model):
        said.append(f"{model_type(model)} computes attention its own way (not through transformers' "
                    "AttentionInterface), so these maps come from its eager attention, held whole: long inputs, "
                    "edge knockout and the explanations that differentiate through attention are not available "
                    "for it.")
    text = _text_config(model.config)
    total = _first(text, "num_hidden_layers", "n_layer", "num_layers")
    numbers = [maps.layer_number(i) for i in range(maps.num_layers)]
    if total and len(numbers) < total:
        others = [i for i in range(total) if i not in numbers]
        types = next((t for t in (getattr(text, n, None) for n in ("layer_types", "layers_block_type"))
                      if isinstance(t, (list, tuple)) and len(t) == total), None)
        kinds = sorted({str(types[i]).replace("_", " ") for i in others}) if types else []
        kind = " / ".join(kinds) if kinds else "of another kind (state-space or linear attention)"
        said.append(f"A hybrid: {len(numbers)} of its {total} layers {'attends' if len(numbers) == 1 else 'attend'} "
                    f"with softmax ({_layers(numbers)}), shown under the model's own layer numbers; "
                    f"{_layers(others)} {'is' if len(others) == 1 else 'are'} {kind} and "
                    f"{'has' if len(others) == 1 else 'have'} no attention map.")
    return tuple(said)


def _layers(numbers: list[int]) -> str:
    return ("layer " if len(numbers) == 1 else "layers ") + _ranges(numbers)


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0–2, 5"``."""
    parts, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(str(n) if start == n else f"{start}–{n}")
            start = None
    return ", ".join(parts)


BANDED = ("longformer", "led")  # eager attentions given as each row's window of keys, not as (q, k)
SCORES_RETURNED = ("squeezebert",)  # returns its masked scores before the softmax as its "attentions"
BLOCKED = ("longt5",)  # eager encoder maps by block, each over its own and its neighbours' keys


def _unblock(blocks: torch.Tensor, length: int) -> torch.Tensor:
    """LongT5's local attention ``(B, blocks, H, L, 3L)`` (block ``b``'s row ``r`` is query
    ``bL + r``; its column ``c`` is key ``(b − 1)L + c``) as ``(B, H, length, length)``.
    Transient-global attention, whose extra columns summarise blocks rather than tokens, is returned
    as it is (and refused as no square map)."""
    batch, count, heads, size, width = blocks.shape
    if width != 3 * size:
        return blocks
    rows = torch.arange(count * size).view(count, size)  # query of (block, row)
    keys = (torch.arange(count)[:, None, None] - 1) * size + torch.arange(width)[None, None, :]
    keys = keys.expand(count, size, width)
    rows = rows[..., None].expand(count, size, width)
    inside = (rows < length) & (keys >= 0) & (keys < length)
    full = blocks.new_zeros(batch, heads, length, length)
    values = blocks.permute(0, 2, 1, 3, 4)  # (B, H, blocks, L, 3L)
    full[..., rows[inside], keys[inside]] = values[..., inside]
    return full


def _unband(band: torch.Tensor) -> torch.Tensor:
    """Longformer's banded maps ``(B, H, N, W + 1)`` (row ``i``'s column ``c`` is key ``i − W/2 + c``; no global
    tokens) as ``(B, H, N, N)``; a band of another width is returned as it is (and refused as no square map)."""
    n, width = band.shape[-2], band.shape[-1]
    if width % 2 != 1:
        return band
    half = width // 2
    rows = torch.arange(n)[:, None]
    keys = rows - half + torch.arange(width)[None, :]  # (N, W + 1)
    inside = (keys >= 0) & (keys < n)
    full = band.new_zeros(*band.shape[:2], n, n)
    full[..., rows.expand_as(keys)[inside], keys[inside]] = band[..., inside]
    return full


def _is_softmax(weights: torch.Tensor) -> bool:
    """Whether ``(B, H, q, k)`` holds softmax rows (each sums to 1, or to 0 for a row that sees nothing, or less
    with a sink), not some other state a linear-attention layer returns in their place."""
    if weights.shape[-1] == 0 or not torch.is_floating_point(weights):
        return False
    sums = weights.float().sum(-1)
    return bool((weights >= -1e-6).all()) and bool((sums <= 1 + 1e-3).all())
