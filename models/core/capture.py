"""Attention capture for transformers models that is proven, thread-safe and memory-aware.

transformers (v5) models call one attention function chosen by name through ``AttentionInterface``. We register our
own, ``"capture"``, which hands the work to transformers' SDPA function (so the model keeps its fast path and its
outputs are bit-for-bit those of ``attn_implementation="sdpa"``) and, while a ``recording`` is active in the calling
thread, keeps each layer's post-projection, post-RoPE queries and keys plus the mask exactly as SDPA will apply it.
Weights are recomputed per layer on demand (``results.RecomputedAttention``): softmax(q kᵀ · scaling + mask).

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

import torch

from models.core import memory

ATTENTION_NAME = "capture"
CAPTURE_DESCRIPTION = "AttentionInterface 'capture' (SDPA forward; weights recomputed from the layer's q, k and mask)"
CROSS_ATTENTION_NAMES = ("encoder_attn", "crossattention", "EncDecAttention", "cross_attn")

_ACTIVE: contextvars.ContextVar["Recorder | None"] = contextvars.ContextVar("attention_recorder", default=None)
_KNOCKOUT: contextvars.ContextVar["Knockout | None"] = contextvars.ContextVar("attention_knockout", default=None)
# an attention function that replaces SDPA for this thread's calls (the explanations' differentiable eager attention)
_OVERRIDE: contextvars.ContextVar = contextvars.ContextVar("attention_override", default=None)
_registered = False


def register() -> None:
    """Register the capture attention function and its mask function (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, capture_attention_forward)
    # Without a registered mask function transformers builds *no* mask for an unknown implementation name; SDPA's
    # own masks (boolean, True = attend; None + is_causal for plain causal) are what our forward hands to SDPA.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    _registered = True


def capture_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """The attention function models call: SDPA for the output, and a record of q, k, mask when recording."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    knockout = _KNOCKOUT.get()
    if knockout is not None:
        attention_mask = knockout.mask(module, attention_mask, query.shape[2], key.shape[2], query.device, kwargs)
    override = _OVERRIDE.get()
    if override is not None:
        return override(module, query, key, value, attention_mask, **kwargs)
    recorder = _ACTIVE.get()
    if recorder is not None:
        recorder.record(module, query, key, attention_mask, kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


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
    """One attention call: ``query (B, H, q, d)``, ``key (B, H_kv, k, d)`` on CPU (float32; float16 beyond
    ``HALF_PRECISION_TOKENS`` keys), and its mask."""

    name: str
    query: torch.Tensor
    key: torch.Tensor
    scaling: float
    allowed: torch.Tensor  # bool (B or 1, q, k), True = the key is visible
    bias: torch.Tensor | None  # additive (B or 1, H or 1, q, k) or None


@dataclass
class Recorder:
    """Per-call state: which module is which layer, and what each layer saw."""

    module_names: dict[int, str]
    encoder_decoder: bool = False  # only then do "encoder." / "decoder." names mean different kinds
    records: dict[str, list[LayerRecord]] = field(default_factory=dict)
    _mask_cache: dict = field(default_factory=dict)  # id(mask) or an implicit-mask shape -> (allowed, bias)

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

    def record(self, module, query, key, attention_mask, kwargs) -> None:
        name = self.module_names.get(id(module), f"<unnamed {type(module).__name__}>")
        kind = self.kind_of(module, name)
        q_len, k_len = query.shape[2], key.shape[2]
        scaling = kwargs.get("scaling")
        scaling = float(scaling) if scaling is not None else 1.0 / float(query.shape[-1]) ** 0.5
        allowed, bias = self._mask(module, attention_mask, kwargs, q_len, k_len, lazy=k_len > HALF_PRECISION_TOKENS)
        position_bias = kwargs.get("position_bias")
        if position_bias is not None:  # T5-style relative bias, added to the scores by SDPA
            position_bias = position_bias[..., -k_len:].detach().to("cpu", torch.float32)
            bias = position_bias if bias is None else bias + position_bias
        half = k_len > HALF_PRECISION_TOKENS and _fits_half(query) and _fits_half(key)
        self.records.setdefault(kind, []).append(LayerRecord(
            name, _compact_copy(query, half), _compact_copy(key, half), scaling, allowed, bias))

    def _mask(self, module, attention_mask, kwargs, q_len: int, k_len: int, lazy: bool = False):
        """The mask exactly as ``sdpa_attention_forward`` applies it, as (allowed bool, additive bias or None).
        ``lazy``: SDPA's implicit causal mask as a ``results.CausalMask`` (its shape), not a ``(q, k)`` array."""
        if attention_mask is None:
            is_causal = kwargs.get("is_causal")
            is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            shape_key = ("implicit", q_len, k_len, bool(q_len > 1 and is_causal), lazy)
            if shape_key in self._mask_cache:  # one (q, k) mask shared by every layer, not one per layer
                return self._mask_cache[shape_key]
            if q_len > 1 and is_causal:
                from models.core.results import CausalMask

                # SDPA's is_causal aligns top-left: query i sees keys 0..i (keys past q_len are cropped by SDPA);
                # a long input keeps it as its shape, a short one as the array every layer shares
                causal = CausalMask(q_len, k_len)
                allowed = causal if lazy else torch.from_numpy(causal.array())[None]
            else:
                allowed = torch.ones(1, q_len, k_len, dtype=torch.bool)
            self._mask_cache[shape_key] = (allowed, None)
            return self._mask_cache[shape_key]
        cached = self._mask_cache.get(id(attention_mask))
        if cached is not None:
            return cached
        mask = attention_mask.detach().to("cpu")[..., -k_len:]
        if mask.dtype == torch.bool:
            result = (mask[:, 0] if mask.ndim == 4 else mask, None)
        else:  # additive float mask: very negative = blocked, anything else a bias SDPA adds
            blocked = mask <= torch.finfo(mask.dtype).min / 2
            bias = torch.where(blocked, torch.zeros((), dtype=mask.dtype), mask).to(torch.float32)
            allowed = ~blocked
            result = (allowed[:, 0] if allowed.ndim == 4 else allowed, bias if bias.abs().max() > 0 else None)
        self._mask_cache[id(attention_mask)] = result
        return result

    # --- turning records into results ---------------------------------------------------------------------------

    def kinds(self) -> list[str]:
        return list(self.records)

    def attention_maps(self, kind: str, batch_index: int = 0, query_positions=None, key_positions=None,
                       query_tokens: list[str] | None = None, key_tokens: list[str] | None = None):
        """``RecomputedAttention`` for one item of the batch, restricted to the given positions (e.g. no padding).

        ``query_positions``/``key_positions``: index arrays into the sequence (default: all).
        """
        from models.core.results import RecomputedAttention

        if kind not in self.records:
            raise ValueError(f"no {kind!r} attention was recorded (recorded: {', '.join(self.records) or 'none'})")
        layers = self.records[kind]
        q_len, k_len = layers[0].query.shape[2], layers[0].key.shape[2]
        # all positions: a slice, so the maps share the recorded tensors' memory instead of copying every layer
        q_pos = slice(None) if query_positions is None else torch.as_tensor(query_positions)
        k_pos = slice(None) if key_positions is None else torch.as_tensor(key_positions)
        queries, keys, scalings, masks, mask_index, biases = [], [], [], [], [], []
        mask_ids: dict[int, int] = {}
        for rec in layers:
            queries.append(_item(rec.query, batch_index)[:, q_pos].contiguous().numpy())
            keys.append(_item(rec.key, batch_index)[:, k_pos].contiguous().numpy())
            scalings.append(rec.scaling)
            if id(rec.allowed) not in mask_ids:
                mask_ids[id(rec.allowed)] = len(masks)
                masks.append(_mask_item(rec.allowed, batch_index, q_pos, k_pos))
            mask_index.append(mask_ids[id(rec.allowed)])
            if rec.bias is None:
                biases.append(None)
            else:
                bias = _item(rec.bias, batch_index)
                heads = rec.query.shape[1]
                biases.append(bias.expand(heads, -1, -1)[:, q_pos][:, :, k_pos].contiguous().numpy())
        n_q = q_len if query_positions is None else len(q_pos)
        n_k = k_len if key_positions is None else len(k_pos)
        return RecomputedAttention(
            kind=kind,
            query_tokens=list(query_tokens) if query_tokens is not None else [str(i) for i in range(n_q)],
            key_tokens=list(key_tokens) if key_tokens is not None else [str(i) for i in range(n_k)],
            queries=queries, keys=keys, scalings=scalings, allowed_masks=masks, mask_index=mask_index,
            biases=biases if any(b is not None for b in biases) else [],
        )


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


def _compact_copy(tensor: torch.Tensor, half: bool = False) -> torch.Tensor:
    """A contiguous CPU float32 (``half``: float16) copy of ``(B, H, n, d)`` q or k.

    Always a copy: GPT-2's q and k are strided views into the fused ``c_attn`` output, so keeping the view would keep
    q, k *and* v of every layer alive (1.5× the memory), and a static KV cache is overwritten in place later.
    A large copy lives in its own anonymous mapping, not in the malloc heap: kept copies interleaved with the
    forward's short-lived activations pinned the freed heap (glibc cannot give back memory below a live block), which
    cost 150 MB of extra peak RSS at 2,048 tokens on GPT-2 small; the mapping is returned to the OS when freed.
    """
    tensor = tensor.detach()
    dtype = torch.float16 if half else torch.float32
    nbytes = tensor.numel() * dtype.itemsize
    if nbytes < OWN_MAPPING_BYTES:
        return tensor.to("cpu", dtype, memory_format=torch.contiguous_format, copy=True)
    # the tensor holds a reference to the mapping, so it lives exactly as long as the copy (torch.frombuffer)
    out = torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(tensor.shape)
    return out.copy_(tensor)


def _mask_item(allowed, index: int, q_pos, k_pos):
    """One batch item's mask at the given positions: a ``CausalMask`` stays one while every position is kept."""
    from models.core.results import CausalMask

    if isinstance(allowed, CausalMask):
        if isinstance(q_pos, slice) and isinstance(k_pos, slice):
            return allowed
        allowed = torch.from_numpy(allowed.array())[None]
    return _item(allowed, index)[q_pos][:, k_pos].contiguous().numpy()


def _item(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Batch item ``index`` of a tensor whose batch dimension may be broadcast (size 1)."""
    return tensor[index if tensor.shape[0] > 1 else 0]


@contextlib.contextmanager
def recording(model: torch.nn.Module):
    """Record every attention call of ``model`` made in this thread inside the ``with`` block.

    The model must have been loaded with ``attn_implementation="capture"``; anything else would silently record
    nothing, so it is refused.
    """
    recorder = Recorder(module_names={id(m): name for name, m in model.named_modules()},
                        encoder_decoder=bool(getattr(model.config, "is_encoder_decoder", False)))
    with observing(model, recorder):
        yield recorder


@contextlib.contextmanager
def observing(model: torch.nn.Module, recorder: Recorder):
    """Hand every attention call of ``model`` in this thread to ``recorder.record`` inside the ``with`` block: a
    ``Recorder`` subclass may reduce each layer at once instead of keeping its q and k (corpus statistics do)."""
    register()
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation != ATTENTION_NAME:
        raise ValueError(f"this model runs attention with {implementation!r}; load it with "
                         f"attn_implementation={ATTENTION_NAME!r} (models.core.loading does) to capture attention")
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
        memory.release_freed_heap()  # the forward's activations, freed but pinned in the heap (models/core/memory.py)
