"""Why a head looks where it does: one attention score split exactly into what wrote its query and what wrote its
key (the QK circuit of Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits", read on the run a
user has, with no dictionary and no replacement model).

Head ``h`` of layer ``l`` scores query ``i`` against key ``j`` as ``s = scaling · q_i · k_j`` (+ any bias the model
adds to the score; a soft cap, when the model has one, comes after: what is split is the score before the cap). The
residual stream entering layer ``l`` is a sum of components: the token embedding, the position embedding where the
model has one (and BERT's token type), each earlier head's output (its slice of the attention output times its slice
of the output projection, through any post-attention norm and layer scale), each earlier MLP's output, and bias
terms. Every normalisation is frozen at the scale it had in this run:

- RMSNorm: ``y = D ⊙ x`` with ``D = y / x`` read off the run (exact whatever precision the norm computed in);
- LayerNorm: ``y = γ ⊙ (x − mean x) / σ + β`` with ``σ`` of this run: linear in ``x`` plus the constant ``β``;
- QK-norm (Qwen3, Gemma 3, OLMo 2) the same way on the projected query or key;
- RoPE is a rotation by a position's angles: linear.

So ``q_i = Σ_a Q(c_a(i)) + bias_q`` and ``k_j = Σ_b K(c_b(j)) + bias_k``, and ``s = Σ_a Σ_b s_ab`` exactly, with
``s_ab = scaling · Q(c_a(i)) · K(c_b(j))``. Post-norm models (BERT) send every component through each frozen
LayerNorm after it, whose ``β`` becomes a component of its own. RoPE gives a second split of the same score over its
frequency pairs: ``s = Σ_k scaling · (q_k k_k + q_{k+d/2} k_{k+d/2})``.

Components are projected one layer at a time (never ``components × tokens × d_model`` for every layer): only the
positions of the cells asked about are kept. The stream is read from one forward with hooks (``hooks.installed``)
stopped at layer ``l``, or, when a language-model run kept its whole residual stream, from the run itself with no
forward at all (each earlier head's output rebuilt from that layer's stream and its recomputed attention row).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.core import capture, hooks, memo
from models.core.results import DescribedMask, RecomputedAttention, RelativeBias, RunResult, TextResult

# --- what the model is: written down per architecture ---------------------------------------------------------------

# pre-norm decoders: (the norm before attention, the norm on the attention's output before it joins the stream)
DECODERS = {
    "llama": ("input_layernorm", None), "mistral": ("input_layernorm", None), "qwen2": ("input_layernorm", None),
    "qwen3": ("input_layernorm", None), "gpt_oss": ("input_layernorm", None),
    "gemma2": ("input_layernorm", "post_attention_layernorm"),
    "gemma3_text": ("input_layernorm", "post_attention_layernorm"),
    "olmo2": (None, "post_attention_layernorm"),
}
ENCODERS = ("bert", "roberta")
SUPPORTED = (*DECODERS, "gpt2", *ENCODERS, "dinov2", "timm VisionTransformer")
# from the run, no forward: models whose attention rows the capture reproduces exactly (no sinks, no soft cap)
FROM_RUN = ("llama", "mistral", "qwen2", "qwen3", "olmo2", "gpt2")


@dataclass(frozen=True)
class Projection:
    """``y = x @ weight.T + bias``: one of a layer's projections (a slice of a fused one), the model's own tensors."""

    weight: torch.Tensor  # (out, in)
    bias: torch.Tensor | None


@dataclass(frozen=True)
class Block:
    """One residual block as the decomposition reads it (TransformerLens writes its component mapping down the
    same way)."""

    module: nn.Module  # its first input is the stream entering the block
    attention: nn.Module  # its first input is what q, k and v are projected from; RoPE's (cos, sin) reach it
    call: nn.Module | None  # the module the attention function is called for (transformers); None: timm
    query: Projection  # (heads · d_head, d)
    key: Projection  # (kv_heads · d_head, d)
    value: Projection
    output: nn.Module  # the output projection: its input is every head's output side by side
    output_weight: torch.Tensor  # (d, heads · d_head)
    output_bias: torch.Tensor | None
    input_norm: nn.Module | None = None  # pre-norm before attention (None: OLMo 2, post-norm BERT)
    query_norm: nn.Module | None = None  # QK-norm
    key_norm: nn.Module | None = None
    write_norm: nn.Module | None = None  # a norm on the attention's output before it joins the stream (Gemma, OLMo 2)
    layer_scale: torch.Tensor | None = None  # (d,): DINOv2's layer scale on the attention's output
    attention_norm: nn.Module | None = None  # post-norm: LayerNorm(stream + attention)
    output_norm: nn.Module | None = None  # post-norm: LayerNorm(that + MLP)
    query_site: nn.Module | None = None  # timm: q and k as the attention reads them (the q_norm / k_norm outputs)
    key_site: nn.Module | None = None
    sinks: torch.Tensor | None = None  # (heads,) a sink logit per head (gpt-oss): a softmax column of its own
    softcap: float | None = None  # Gemma 2: scores capped by softcap · tanh(s / softcap) after the split


@dataclass(frozen=True)
class Architecture:
    name: str  # config.model_type, or "timm VisionTransformer"
    blocks: tuple[Block, ...]
    heads: int
    kv_heads: int
    head_dim: int
    width: int  # d_model
    embedding: str  # how the first block's input splits: "token", "gpt2", "bert", "timm", "dinov2"
    embedding_modules: tuple[nn.Module, ...] = ()  # bert: word, token type, position; gpt2: wte; vit: patches
    embedding_norm: nn.Module | None = None  # bert
    post_norm: bool = False
    rope: bool = False
    prefix: tuple[torch.Tensor, ...] = ()  # vit: the prefix tokens' own vectors ([CLS], registers), in order

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def _linear(module: nn.Module) -> Projection:
    return Projection(module.weight, module.bias)


def _rows(projection: Projection, start: int, stop: int) -> Projection:
    return Projection(projection.weight[start:stop], None if projection.bias is None else projection.bias[start:stop])


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", "") or type(model).__name__)


def architecture(model: nn.Module) -> Architecture:
    """The decomposition's map of ``model``, or a ``ValueError`` naming its architecture when it is not one of
    ``SUPPORTED``."""
    return _FOUND.get(model, lambda: _architecture(model))


_FOUND: "memo.PerObject[Architecture]" = memo.PerObject()  # per model, for its lifetime


def _refuse(model: nn.Module) -> ValueError:
    return ValueError(f"The score decomposition does not know the {_model_type(model)!r} architecture: it reads "
                      "Llama-family decoders (Llama, Mistral, Qwen 2/3, Gemma 2/3, OLMo 2, gpt-oss), GPT-2, BERT and "
                      "RoBERTa encoders, DINOv2 and timm Vision Transformers, whose every step from the residual "
                      "stream to a score is written down here. Pick one of those.")


def _architecture(model: nn.Module) -> Architecture:
    if hasattr(model, "blocks") and hasattr(model, "patch_embed") and not hasattr(model, "config"):
        return _timm_architecture(model)
    kind = _model_type(model)
    if kind in DECODERS:
        return _decoder_architecture(model, kind)
    if kind == "gpt2":
        return _gpt2_architecture(model)
    if kind in ENCODERS:
        return _bert_architecture(model)
    if kind == "dinov2":
        return _dinov2_architecture(model)
    raise _refuse(model)


def _decoder_architecture(model: nn.Module, kind: str) -> Architecture:
    config = model.config
    base = getattr(model, "model", model)
    norm_name, write_name = DECODERS[kind]
    blocks = []
    for layer in base.layers:
        attention = layer.self_attn
        blocks.append(Block(
            module=layer, attention=attention, call=attention, query=_linear(attention.q_proj),
            key=_linear(attention.k_proj), value=_linear(attention.v_proj), output=attention.o_proj,
            output_weight=attention.o_proj.weight, output_bias=attention.o_proj.bias,
            input_norm=getattr(layer, norm_name) if norm_name else None,
            query_norm=getattr(attention, "q_norm", None), key_norm=getattr(attention, "k_norm", None),
            write_norm=getattr(layer, write_name) if write_name else None,
            sinks=getattr(attention, "sinks", None),
            softcap=getattr(attention, "attn_logit_softcapping", None) or None))
    first = base.layers[0].self_attn
    heads = config.num_attention_heads
    head_dim = first.q_proj.weight.shape[0] // heads
    kv_heads = first.k_proj.weight.shape[0] // head_dim
    return Architecture(kind, tuple(blocks), heads, kv_heads, head_dim, config.hidden_size, "token", rope=True)


def _gpt2_architecture(model: nn.Module) -> Architecture:
    base = getattr(model, "transformer", model)
    width = model.config.n_embd
    blocks = []
    for layer in base.h:
        attention = layer.attn
        if getattr(attention, "is_cross_attention", False):
            raise _refuse(model)
        fused = Projection(attention.c_attn.weight.T, attention.c_attn.bias)  # Conv1D keeps (in, out)
        blocks.append(Block(
            module=layer, attention=attention, call=attention, query=_rows(fused, 0, width),
            key=_rows(fused, width, 2 * width), value=_rows(fused, 2 * width, 3 * width), output=attention.c_proj,
            output_weight=attention.c_proj.weight.T, output_bias=attention.c_proj.bias, input_norm=layer.ln_1))
    heads = model.config.n_head
    return Architecture("gpt2", tuple(blocks), heads, heads, width // heads, width, "gpt2",
                        embedding_modules=(base.wte,))


def _bert_architecture(model: nn.Module) -> Architecture:
    base = getattr(model, "base_model", model)
    embeddings = base.embeddings
    blocks = []
    for layer in base.encoder.layer:
        inner, output = layer.attention.self, layer.attention.output
        blocks.append(Block(
            module=layer, attention=inner, call=inner, query=_linear(inner.query), key=_linear(inner.key),
            value=_linear(inner.value), output=output.dense, output_weight=output.dense.weight,
            output_bias=output.dense.bias, attention_norm=output.LayerNorm, output_norm=layer.output.LayerNorm))
    config = model.config
    heads = config.num_attention_heads
    return Architecture(_model_type(model), tuple(blocks), heads, heads, config.hidden_size // heads,
                        config.hidden_size, "bert", post_norm=True,
                        embedding_modules=(embeddings.word_embeddings, embeddings.token_type_embeddings,
                                           embeddings.position_embeddings),
                        embedding_norm=embeddings.LayerNorm)


def _dinov2_architecture(model: nn.Module) -> Architecture:
    base = getattr(model, "dinov2", model)
    blocks = []
    for layer in base.encoder.layer:
        attention = layer.attention
        blocks.append(Block(
            module=layer, attention=attention, call=attention, query=_linear(attention.q_proj),
            key=_linear(attention.k_proj), value=_linear(attention.v_proj), output=attention.o_proj,
            output_weight=attention.o_proj.weight, output_bias=attention.o_proj.bias, input_norm=layer.norm1,
            layer_scale=layer.layer_scale1.lambda1))
    config = model.config
    heads = config.num_attention_heads
    return Architecture("dinov2", tuple(blocks), heads, heads, config.hidden_size // heads, config.hidden_size,
                        "dinov2", embedding_modules=(base.embeddings.patch_embeddings,),
                        prefix=(base.embeddings.cls_token[0, 0],))


def _timm_architecture(model: nn.Module) -> Architecture:
    width = model.embed_dim if hasattr(model, "embed_dim") else model.blocks[0].attn.qkv.in_features
    if not isinstance(getattr(model, "norm_pre", nn.Identity()), nn.Identity) or \
            getattr(model.patch_embed, "dynamic_img_size", False):
        raise ValueError(f"The score decomposition reads plain timm Vision Transformers (ViT, DeiT, DINOv2); "
                         f"{type(model).__name__} normalises its embeddings first or has no fixed patch grid.")
    blocks = []
    for block in model.blocks:
        attention = block.attn
        if type(attention).__name__ != "Attention" or getattr(attention, "gate", None) is not None or \
                not isinstance(getattr(attention, "norm", nn.Identity()), nn.Identity):
            raise ValueError(f"The score decomposition reads timm's plain multi-head attention; this model's "
                             f"blocks use {type(attention).__name__} (with a gate or an output norm).")
        if not isinstance(attention.q_norm, nn.Identity):
            raise ValueError("The score decomposition does not read timm's QK-norm yet: pick a ViT without it.")
        fused = _linear(attention.qkv)
        scale = getattr(block.ls1, "gamma", None)
        blocks.append(Block(
            module=block, attention=attention, call=None, query=_rows(fused, 0, width),
            key=_rows(fused, width, 2 * width), value=_rows(fused, 2 * width, 3 * width), output=attention.proj,
            output_weight=attention.proj.weight, output_bias=attention.proj.bias, input_norm=block.norm1,
            layer_scale=scale, query_site=attention.q_norm, key_site=attention.k_norm))
    heads = model.blocks[0].attn.num_heads
    prefix = []
    if getattr(model, "cls_token", None) is not None:
        prefix.append(model.cls_token[0, 0])
    if getattr(model, "reg_token", None) is not None:
        prefix.extend(model.reg_token[0])
    if len(prefix) != model.num_prefix_tokens:
        raise ValueError("The score decomposition reads ViTs whose prefix tokens are [CLS] and registers only.")
    return Architecture("timm VisionTransformer", tuple(blocks), heads, heads, width // heads, width, "timm",
                        embedding_modules=(model.patch_embed,), prefix=tuple(prefix))


# --- components -------------------------------------------------------------------------------------------------------

# what each head is, in words, from the roles the app measures on repeated random tokens (models.analysis.roles)
ROLE_WORDS = {"previous_token_role": "previous-token head", "induction": "induction head",
              "duplicate_token": "duplicate-token head"}
ROLE_MIN = 0.3  # a head is named after a role once it puts this much attention where the role says
SINK_MIN = 0.8  # ... or after the first token, when it parks at least this much there and has no other role


@dataclass(frozen=True)
class Component:
    """One term of the residual stream (or of a projection's bias), named in words."""

    kind: str  # token, position, token_type, content, head, attention_bias, mlp, norm_bias, query_bias, key_bias
    layer: int = -1
    head: int = -1
    name: str = ""  # the same at every position: "layer 3 head 5 (previous-token head)", "MLP 2", "token embedding"

    def at(self, label: str) -> str:
        """The name at one position whose token is ``label`` ("embedding of ' Paris'")."""
        if self.kind == "token":
            return f"embedding of {label!r}"
        if self.kind == "content":
            return f"{label} embedding"
        return self.name


def role_names(roles: dict[str, np.ndarray] | None) -> dict[tuple[int, int], str]:
    """``(layer, head) -> role`` in words for the heads whose role score clears ``ROLE_MIN`` (``SINK_MIN`` for the
    first-token sink), from ``models.analysis.roles`` scores ``{role: (layers, heads)}``."""
    if not roles:
        return {}
    named = {}
    layers, heads = next(iter(roles.values())).shape
    for layer in range(layers):
        for head in range(heads):
            best = max(ROLE_WORDS, key=lambda role: float(roles[role][layer, head]) if role in roles else -1.0)
            if best in roles and roles[best][layer, head] >= ROLE_MIN:
                named[(layer, head)] = ROLE_WORDS[best]
            elif "sink" in roles and roles["sink"][layer, head] >= SINK_MIN:
                named[(layer, head)] = "first-token sink"
    return named


def _head_component(layer: int, head: int, named: dict) -> Component:
    role = named.get((layer, head))
    return Component("head", layer, head, f"layer {layer} head {head}" + (f" ({role})" if role else ""))


# --- what the run says at the positions asked about -----------------------------------------------------------------

@dataclass
class LayerStream:
    """What one block below the target wrote, at the positions: float64 ``(P, ·)``."""

    x_in: torch.Tensor  # the stream entering the block (d)
    heads: torch.Tensor  # every head's output side by side, the output projection's input (heads · d_head)
    write: tuple[torch.Tensor, torch.Tensor] | None = None  # the write norm's (input, output) (d each)
    attention_norm: tuple[torch.Tensor, torch.Tensor] | None = None  # post-norm LayerNorm (input, output)
    output_norm: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class Captured:
    """The stream at ``positions`` up to the target layer, and the target layer's q, k and mask."""

    positions: list[int]
    embedding: dict[str, torch.Tensor]  # part -> (P, d): "token", "position", "token_type", "content"
    embedding_norm: tuple[torch.Tensor, torch.Tensor] | None  # bert: the embedding LayerNorm's (input, output)
    layers: list[LayerStream]  # blocks 0 .. l − 1
    x: torch.Tensor  # (P, d) the stream entering block l
    normed: torch.Tensor  # (P, d) what block l's attention projects (the pre-norm's output, or the stream)
    cos: torch.Tensor | None  # (P, d_head) RoPE at the positions
    sin: torch.Tensor | None
    maps: RecomputedAttention  # q (heads, T, d_head) and k (kv_heads, T, d_head) of block l as the model kept them
    maps_layer: int  # which layer of ``maps`` is block l
    source: str  # "forward" or "run"


class _Stop(Exception):
    """Raised by a hook once block l's q and k are recorded: nothing after them is needed."""


def _at(tensor: torch.Tensor, batch: int, index: torch.Tensor) -> torch.Tensor:
    """``(B, T, …)`` at one batch item's positions -> float64 on the CPU ``(P, …)`` (a batch of 1 broadcasts)."""
    item = tensor[batch if tensor.shape[0] > 1 else 0]
    return item.index_select(0, index.to(item.device)).detach().to("cpu", torch.float64)


def _first_input(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


@dataclass
class _TargetRecorder(capture.Recorder):
    """Records block l's attention call only (q and k at the model's own precision), then stops the forward."""

    target: nn.Module | None = None

    def attend(self, module, query, key, value, attention_mask, kwargs):
        if module is not self.target:
            return None
        self.record(module, query, key, attention_mask, kwargs)
        kept = self.records[self.kind_of(module, "target")][-1]
        kept.query, kept.key = query.detach().clone(), key.detach().clone()  # not capture's compact float16
        raise _Stop


def capture_forward(model: nn.Module, forward: Callable[[], object], layer: int, positions: list[int],
                    batch: int = 0, tokens: list[str] | None = None) -> Captured:
    """Run ``forward()`` (a forward of ``model`` on its inputs) up to block ``layer``'s scores, keeping the stream at
    ``positions`` of batch item ``batch`` (hooks for this call only, ``hooks.installed``)."""
    arch = architecture(model)
    if not 0 <= layer < len(arch.blocks):
        raise ValueError(f"layer {layer} does not exist: this model has layers 0..{len(arch.blocks) - 1}")
    index = torch.tensor(sorted(set(positions)), dtype=torch.int64)
    kept: dict = {}
    installed: list[hooks.Hook] = []

    def keep_input(name):
        def hook(module, args, kwargs):
            kept[name] = _at(_first_input(args, kwargs), batch, index)
        return hook

    def keep_output(name):
        def hook(module, args, output):
            kept[name] = _at(hooks.hidden_of(output), batch, index)
        return hook

    for number, block in enumerate(arch.blocks[:layer + 1]):
        installed.append(hooks.before(block.module, keep_input(("x", number)), with_kwargs=True))
        if number == layer:
            break
        installed.append(hooks.before(block.output, keep_input(("heads", number)), with_kwargs=True))
        for name, norm in (("write", block.write_norm), ("attention_norm", block.attention_norm),
                           ("output_norm", block.output_norm)):
            if norm is not None:
                installed += [hooks.before(norm, keep_input((name, number, "in")), with_kwargs=True),
                              hooks.after(norm, keep_output((name, number, "out")))]
    target = arch.blocks[layer]

    def keep_target(module, args, kwargs):
        kept["normed"] = _at(_first_input(args, kwargs), batch, index)
        rotary = kwargs.get("position_embeddings")
        if rotary is not None:
            kept["cos"], kept["sin"] = (_at(part, batch, index) for part in rotary)

    installed.append(hooks.before(target.attention, keep_target, with_kwargs=True))
    if arch.embedding in ("timm", "dinov2"):
        installed.append(_vit_content_hook(arch, index, batch, kept))
    else:
        for number, module in enumerate(arch.embedding_modules):
            installed.append(hooks.after(module, keep_output(("embedding", number))))
    if arch.embedding_norm is not None:
        installed += [hooks.before(arch.embedding_norm, keep_input(("embedding_norm", "in")), with_kwargs=True),
                      hooks.after(arch.embedding_norm, keep_output(("embedding_norm", "out")))]
    timm_qk: dict = {}
    if target.call is None:  # timm: q and k leave q_norm / k_norm as (B, heads, T, d_head)
        def keep_query(module, args, output):
            timm_qk["query"] = output[batch].detach().clone()

        def keep_key(module, args, output):
            timm_qk["key"] = output[batch].detach().clone()
            raise _Stop

        installed += [hooks.after(target.query_site, keep_query), hooks.after(target.key_site, keep_key)]
    recorder = None
    with torch.inference_mode(), hooks.installed(installed):
        try:
            if target.call is not None:
                recorder = _TargetRecorder(module_names={id(target.call): "target"}, target=target.call)
                with capture.observing(model, recorder):
                    forward()
            else:
                forward()
        except _Stop:
            pass
    if recorder is not None:
        if not recorder.records:
            raise ValueError(f"layer {layer}'s attention was never called: the decomposition cannot read it")
        kind = next(iter(recorder.records))
        maps = recorder.attention_maps(kind, batch, query_tokens=tokens, key_tokens=tokens)
    else:
        if "key" not in timm_qk:
            raise ValueError(f"layer {layer}'s attention was never called: the decomposition cannot read it")
        count = timm_qk["query"].shape[1]
        names = tokens or [str(i) for i in range(count)]
        maps = RecomputedAttention("self", names, names, [timm_qk["query"]], [timm_qk["key"]],
                                   [float(target.attention.scale)], [DescribedMask(count, count)], [0])
    layers = []
    for number in range(layer):
        def pair(name):
            return (kept[(name, number, "in")], kept[(name, number, "out")]) if (name, number, "in") in kept \
                else None
        layers.append(LayerStream(kept[("x", number)], kept[("heads", number)], pair("write"),
                                  pair("attention_norm"), pair("output_norm")))
    embedding = _embedding_parts(arch, kept, kept[("x", 0)])
    norm = (kept[("embedding_norm", "in")], kept[("embedding_norm", "out")]) if arch.embedding_norm else None
    return Captured(index.tolist(), embedding, norm, layers, kept[("x", layer)], kept["normed"], kept.get("cos"),
                    kept.get("sin"), maps, 0, "forward")


def _embedding_parts(arch: Architecture, kept: dict, first: torch.Tensor) -> dict[str, torch.Tensor]:
    """The first block's input split into its parts at the positions (``first``: that input)."""
    if arch.embedding == "token":
        return {"token": first}
    if arch.embedding == "gpt2":
        token = kept[("embedding", 0)]
        return {"token": token, "position": first - token}
    if arch.embedding == "bert":
        return {"token": kept[("embedding", 0)], "token_type": kept[("embedding", 1)],
                "position": kept[("embedding", 2)]}
    # ViTs: [CLS] and registers are vectors of their own, patches their projection; the position part is the rest
    content = kept[("embedding", 0)]
    return {"content": content, "position": first - content}


def _vit_content_hook(arch: Architecture, index: torch.Tensor, batch: int, kept: dict) -> hooks.Hook:
    """The content of each position (prefix vectors, then the patch projection) as the first block will see it."""
    prefix = len(arch.prefix)

    def hook(module, args, output):
        patches = output[batch if output.shape[0] > 1 else 0].detach()  # (patches, d)
        rows = []
        for position in index.tolist():
            rows.append(arch.prefix[position].detach() if position < prefix else patches[position - prefix])
        kept[("embedding", 0)] = torch.stack(rows).to("cpu", torch.float64)

    return hooks.after(arch.embedding_modules[0], hook)


def capture_run(model: nn.Module, result: TextResult, layer: int, positions: list[int]) -> Captured:
    """The same as ``capture_forward``, read off a language-model run that kept its whole residual stream, with no
    forward: each earlier head's output at a position is its attention row (recomputed from the run's q and k)
    times that layer's values, ``z_h = W_V (Σ_k A_h[p, k] · normed_k) + b_V``."""
    arch = architecture(model)
    stream, maps = result.residual, result.maps("self")
    index = torch.tensor(sorted(set(positions)), dtype=torch.int64)
    parameter = next(model.parameters())
    dtype, device = parameter.dtype, parameter.device

    def rows_of(number: int) -> torch.Tensor:
        return torch.tensor(stream[number], device=device, dtype=dtype)  # a copy: the run's array is read-only

    layers, heads, group, size = [], arch.heads, arch.group, arch.head_dim
    with torch.inference_mode():
        for number in range(layer):
            block = arch.blocks[number]
            x = rows_of(number)  # (T, d)
            normed = block.input_norm(x) if block.input_norm is not None else x
            weights = _attention_rows(maps, number, index).to(device, dtype)  # (P, heads, T)
            value_weight = block.value.weight.reshape(arch.kv_heads, size, -1)  # (kv, d_head, d)
            per_head = value_weight.repeat_interleave(group, 0)  # (heads, d_head, d)
            if len(index) * heads * arch.width < arch.kv_heads * size * arch.width + len(index) * heads * size:
                mixed = torch.einsum("pht,td->phd", weights, normed)  # (P, heads, d): few rows, no values
                outputs = torch.einsum("phd,hed->phe", mixed, per_head)
            else:
                values = F.linear(normed, block.value.weight).reshape(-1, arch.kv_heads, size)  # (T, kv, d_head)
                outputs = torch.einsum("pht,thf->phf", weights, values.repeat_interleave(group, 1))
            if block.value.bias is not None:  # each row's weights sum to 1
                outputs = outputs + block.value.bias.reshape(arch.kv_heads, size).repeat_interleave(group, 0)
            outputs = outputs.reshape(len(index), heads * size)
            write = None
            if block.write_norm is not None:
                written = F.linear(outputs, block.output_weight, block.output_bias)
                write = (written, block.write_norm(written))
            layers.append(LayerStream(_host(x[index]), _host(outputs),
                                      None if write is None else (_host(write[0]), _host(write[1]))))
        x = rows_of(layer)[index]
        target = arch.blocks[layer]
        normed = target.input_norm(x) if target.input_norm is not None else x
        cos = sin = None
        rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
        if arch.rope:
            cos, sin = rotary(x[None], index[None].to(device))
            cos, sin = _host(cos[0]), _host(sin[0])
        first = layers[0].x_in if layers else _host(x)
        kept = {}
        if arch.embedding == "gpt2":  # the token part from the embedding table; the position part is the rest
            ids = torch.tensor(result.token_ids, device=device)[index.to(device)]
            kept[("embedding", 0)] = _host(arch.embedding_modules[0](ids))
    return Captured(index.tolist(), _embedding_parts(arch, kept, first), None, layers, _host(x), _host(normed), cos,
                    sin, maps, layer, "run")


def _attention_rows(maps: RecomputedAttention, layer: int, index: torch.Tensor) -> torch.Tensor:
    """Every head's attention weights at the rows ``index`` of ``layer`` ``(P, heads, T)`` float32, recomputed from
    the run's q and k (``tiles.cells`` when the layer adds a score bias)."""
    from models.core import tiles

    if layer < len(maps.biases) and maps.biases[layer] is not None:
        scores = maps.scores(layer)
        return torch.stack([tiles.cells(scores, range(maps.num_heads), (p, p + 1), (0, len(maps.key_tokens)))[0, :, 0]
                            for p in index.tolist()]).cpu()
    query = maps.queries[layer][:, index.to(maps.queries[layer].device)].float()  # (heads, P, d_head)
    key = maps.keys[layer].float().repeat_interleave(maps.num_heads // maps.num_kv_heads, 0)  # (heads, T, d_head)
    scores = torch.einsum("hpd,htd->pht", query, key) * maps.scalings[layer]
    allowed = torch.from_numpy(np.stack([maps.row_allowed(layer, p) for p in index.tolist()])).to(scores.device)
    return torch.softmax(scores.masked_fill(~allowed[:, None], -math.inf), dim=-1).cpu()


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", torch.float64)


def from_run_possible(model: nn.Module, result: RunResult, layer: int) -> bool:
    """Whether ``capture_run`` can read ``result``: a prompt run of a model in ``FROM_RUN`` that kept its whole
    residual stream in the model's precision (float64 runs keep it in float32: they take the forward)."""
    arch = architecture(model)
    residual = getattr(result, "residual", None)
    maps = result.attention.get("self") if result.attention else None
    parameter = next(model.parameters())
    return (arch.name in FROM_RUN and residual is not None and getattr(result, "residual_start", 1) == 0
            and isinstance(maps, RecomputedAttention) and residual.shape[0] == len(arch.blocks) + 1
            and residual.shape[1] == len(result.tokens) and parameter.dtype == torch.float32
            and 0 <= layer < len(arch.blocks) and maps.queries[layer].dtype == torch.float32
            and (arch.embedding != "gpt2" or len(getattr(result, "token_ids", ())) == len(result.tokens)))


# --- frozen norms ----------------------------------------------------------------------------------------------------

@dataclass
class FrozenNorm:
    """A norm with its scale frozen at this run's, at some positions: ``y = scale ⊙ (x − mean x if centred) +
    beta``, linear in ``x`` but for the constant ``beta``."""

    scale: torch.Tensor  # (P, d)
    centred: bool
    beta: torch.Tensor | None  # (d,)

    def __call__(self, vectors: torch.Tensor) -> torch.Tensor:
        """``(n, P, d)`` (or ``(P, d)``) components -> their images, without ``beta``."""
        if self.centred:
            vectors = vectors - vectors.mean(-1, keepdim=True)
        return vectors * self.scale

    def rows(self, rows: torch.Tensor) -> "FrozenNorm":
        return FrozenNorm(self.scale[rows], self.centred, self.beta)


def _epsilon(module: nn.Module) -> float:
    for name in ("eps", "variance_epsilon"):
        value = getattr(module, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    raise ValueError(f"the decomposition cannot find {type(module).__name__}'s epsilon")


def frozen(module: nn.Module, inputs: torch.Tensor, outputs: torch.Tensor) -> FrozenNorm:
    """``module`` (a LayerNorm, or an RMSNorm of any flavour) frozen at the scale it applied to ``inputs`` (P, d),
    which it turned into ``outputs``. LayerNorm: ``γ / σ`` with σ of this run. RMSNorm: ``outputs / inputs``, read
    off the run (exact whatever precision the norm computed in; its gain over the run's σ where an input is 0)."""
    if isinstance(module, nn.LayerNorm):
        sigma = torch.sqrt(inputs.var(-1, unbiased=False, keepdim=True) + module.eps)
        gamma = _host(module.weight) if module.weight is not None else torch.ones(inputs.shape[-1])
        beta = _host(module.bias) if module.bias is not None else None
        return FrozenNorm(gamma / sigma, True, beta)
    if getattr(module, "bias", None) is not None and isinstance(module.bias, torch.Tensor):
        raise ValueError(f"{type(module).__name__} has a bias: the decomposition reads RMSNorms without one")
    zero = inputs == 0
    scale = outputs / torch.where(zero, torch.ones_like(inputs), inputs)
    if bool(zero.any()):
        epsilon = _epsilon(module)
        parameter = next(module.parameters())
        with torch.inference_mode():
            gain = _host(module(torch.ones(inputs.shape[-1], dtype=parameter.dtype, device=parameter.device)))
        gain = gain * math.sqrt(1 + epsilon)
        sigma = torch.sqrt(inputs.pow(2).mean(-1, keepdim=True) + epsilon)
        scale = torch.where(zero, gain / sigma, scale)
    return FrozenNorm(scale, False, None)


# --- the stream as its components, layer by layer --------------------------------------------------------------------

@dataclass
class Written:
    """Components as they joined the stream at the positions: ``vectors (n, P, d)``, which then pass through the
    stream norms ``norms[stage:]`` (post-norm models) on their way to the target layer."""

    components: list[Component]
    vectors: torch.Tensor
    stage: int


def stream_norms(arch: Architecture, cap: Captured) -> list[FrozenNorm]:
    """The frozen norms every component crosses after it is written (post-norm: the embedding LayerNorm, then each
    layer's two LayerNorms); none for pre-norm models."""
    if not arch.post_norm:
        return []
    norms = [frozen(arch.embedding_norm, *cap.embedding_norm)]
    for number, written in enumerate(cap.layers):
        block = arch.blocks[number]
        norms += [frozen(block.attention_norm, *written.attention_norm),
                  frozen(block.output_norm, *written.output_norm)]
    return norms


EMBEDDING_NAMES = {"token": "token embedding", "position": "position embedding",
                   "token_type": "token type embedding", "content": "input embedding"}


def written(arch: Architecture, cap: Captured, named: dict) -> Iterator[Written]:
    """Every component in forward order, as it joined the stream at ``cap.positions`` (float64), one layer at a time."""
    count = len(cap.positions)
    parts = [Component(kind, name=EMBEDDING_NAMES[kind]) for kind in cap.embedding]
    yield Written(parts, torch.stack([cap.embedding[kind] for kind in cap.embedding]), 0)
    norms = stream_norms(arch, cap) if arch.post_norm else []
    if arch.post_norm:
        yield Written([Component("norm_bias", name="embedding LayerNorm β")], _beta(norms[0], count), 1)
    size = arch.head_dim
    for number, layer in enumerate(cap.layers):
        block = arch.blocks[number]
        weight = _host(block.output_weight).reshape(arch.width, arch.heads, size)  # (d, heads, d_head)
        heads = torch.einsum("phe,dhe->hpd", layer.heads.reshape(count, arch.heads, size), weight)  # (heads, P, d)
        components = [_head_component(number, head, named) for head in range(arch.heads)]
        if block.output_bias is not None:
            heads = torch.cat([heads, _host(block.output_bias).expand(1, count, -1)])
            components.append(Component("attention_bias", number, name=f"layer {number} attention output bias"))
        if layer.write is not None:  # the post-attention norm, frozen: each head's share of its output
            heads = frozen(block.write_norm, *layer.write)(heads)
        if block.layer_scale is not None:
            heads = heads * _host(block.layer_scale)
        stage = 1 + 2 * number if arch.post_norm else 0
        yield Written(components, heads, stage)
        if arch.post_norm:
            yield Written([Component("norm_bias", number, name=f"layer {number} attention LayerNorm β")],
                          _beta(norms[stage], count), stage + 1)
            mlp = layer.output_norm[0] - layer.attention_norm[1]
            yield Written([Component("mlp", number, name=f"MLP {number}")], mlp[None], stage + 1)
            yield Written([Component("norm_bias", number, name=f"layer {number} output LayerNorm β")],
                          _beta(norms[stage + 1], count), stage + 2)
        else:  # the MLP is what the block added besides its attention
            after = cap.layers[number + 1].x_in if number + 1 < len(cap.layers) else cap.x
            mlp = after - layer.x_in - heads.sum(0)
            yield Written([Component("mlp", number, name=f"MLP {number}")], mlp[None], 0)


def _beta(norm: FrozenNorm, count: int) -> torch.Tensor:
    return norm.beta.expand(1, count, -1).clone()


def propagate(vectors: torch.Tensor, norms: list[FrozenNorm]) -> torch.Tensor:
    """Components ``(n, P, d)`` through frozen stream norms in order (no ``beta``: it is a component of its own)."""
    for norm in norms:
        vectors = norm(vectors)
    return vectors


# --- reading the target layer ---------------------------------------------------------------------------------------

def _rotate_half(vectors: torch.Tensor) -> torch.Tensor:
    half = vectors.shape[-1] // 2
    return torch.cat([-vectors[..., half:], vectors[..., :half]], dim=-1)


def _full_width(part: torch.Tensor, size: int) -> torch.Tensor:
    """RoPE's cos or sin at full head width (gpt-oss keeps one value per frequency pair)."""
    return torch.cat([part, part], dim=-1) if part.shape[-1] * 2 == size else part


@dataclass
class Reader:
    """One side (query or key) of one head of the target layer at some positions: the frozen path from stream
    vectors to the head's q (or k) as the scores use it, and the same path recomputed through the model's modules."""

    norm: FrozenNorm | None  # the pre-norm, frozen at these positions
    weight: torch.Tensor  # (d_head, d) float64: this head's rows of the projection
    bias: torch.Tensor | None  # (d_head,)
    qk_scale: torch.Tensor | None  # (R, d_head): the QK-norm, frozen
    cos: torch.Tensor | None  # (R, d_head)
    sin: torch.Tensor | None
    # the recomputed path
    block: Block
    side: str  # "query" or "key"
    head: int  # this head's index among its side's heads (a key/value group for keys)
    heads: int  # heads on this side

    def only(self, row: int) -> "Reader":
        """The same side at one of its positions."""
        pick = slice(row, row + 1)
        return Reader(None if self.norm is None else self.norm.rows(pick), self.weight, self.bias,
                      None if self.qk_scale is None else self.qk_scale[pick],
                      None if self.cos is None else self.cos[pick], None if self.sin is None else self.sin[pick],
                      self.block, self.side, self.head, self.heads)

    def rope(self, vectors: torch.Tensor) -> torch.Tensor:
        if self.cos is None:
            return vectors
        return vectors * self.cos + _rotate_half(vectors) * self.sin

    def linear(self, vectors: torch.Tensor) -> torch.Tensor:
        """Stream components ``(n, R, d)`` -> their part of this head's vector ``(n, R, d_head)``."""
        normed = self.norm(vectors) if self.norm is not None else vectors
        projected = normed @ self.weight.T
        if self.qk_scale is not None:
            projected = projected * self.qk_scale
        return self.rope(projected)

    def constant(self, rows: int) -> torch.Tensor:
        """What no stream component carries ``(R, d_head)``: the pre-norm's β through the projection, its bias."""
        total = torch.zeros(rows, self.weight.shape[0], dtype=torch.float64)
        if self.norm is not None and self.norm.beta is not None:
            total = total + self.weight @ self.norm.beta
        if self.bias is not None:
            total = total + self.bias
        if self.qk_scale is not None:
            total = total * self.qk_scale
        return self.rope(total)

    def recomputed(self, stream: torch.Tensor) -> torch.Tensor:
        """This head's vector from stream vectors ``(R, d)`` through the model's own modules (every norm computes its
        scale afresh): the intervention check's "norm recomputed"."""
        block = self.block
        projection = block.query if self.side == "query" else block.key
        qk_norm = block.query_norm if self.side == "query" else block.key_norm
        parameter = projection.weight
        with torch.inference_mode():
            x = stream.to(parameter.device, parameter.dtype)
            normed = block.input_norm(x) if block.input_norm is not None else x
            projected = F.linear(normed, projection.weight, projection.bias)
            if qk_norm is not None:
                projected = _qk_norm(qk_norm, projected, self.heads)
            size = projected.shape[-1] // self.heads
            own = _host(projected[:, self.head * size:(self.head + 1) * size])
        return self.rope(own)


def _qk_norm(module: nn.Module, projected: torch.Tensor, heads: int) -> torch.Tensor:
    """A QK-norm applied as the model applies it: per head (Qwen3, Gemma 3: weight of one head's width) or over every
    head at once (OLMo 2), ``(R, heads · d_head)`` in and out."""
    width = next(module.parameters()).numel()
    if width * heads == projected.shape[-1]:
        return module(projected.reshape(projected.shape[0], heads, width)).reshape(projected.shape)
    return module(projected)


def reader(model: nn.Module, arch: Architecture, cap: Captured, layer: int, side: str, head: int,
           rows: torch.Tensor) -> Reader:
    """The ``side`` ("query" or "key") of ``head`` (a query head; its key/value group for keys) at ``rows`` of
    ``cap.positions``."""
    block = arch.blocks[layer]
    projection = block.query if side == "query" else block.key
    qk_norm = block.query_norm if side == "query" else block.key_norm
    heads = arch.heads if side == "query" else arch.kv_heads
    own = head if side == "query" else head // arch.group
    size = arch.head_dim
    norm = None
    if block.input_norm is not None:
        norm = frozen(block.input_norm, cap.x[rows], cap.normed[rows])
    qk_scale = None
    if qk_norm is not None:  # frozen at the scale it applied to this run's projected vectors
        parameter = projection.weight
        with torch.inference_mode():
            projected = F.linear(cap.normed[rows].to(parameter.device, parameter.dtype), projection.weight,
                                 projection.bias)
            scaled = _qk_norm(qk_norm, projected, heads)
        qk_scale = frozen(_RMS(qk_norm), _host(projected), _host(scaled)).scale[:, own * size:(own + 1) * size]
    weight = _host(projection.weight[own * size:(own + 1) * size])
    bias = None if projection.bias is None else _host(projection.bias[own * size:(own + 1) * size])
    cos = sin = None
    if cap.cos is not None:
        cos, sin = _full_width(cap.cos[rows], size), _full_width(cap.sin[rows], size)
    return Reader(norm, weight, bias, qk_scale, cos, sin, block, side, own, heads)


class _RMS(nn.Module):
    """A QK-norm seen over a whole projected row: read off the run like any RMSNorm (``frozen``), its gain repeated
    per head when the norm is per head (only used where an input is exactly 0)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.eps = _epsilon(inner)

    def forward(self, x):
        width = next(self.inner.parameters()).numel()
        return _qk_norm(self.inner, x[None], x.shape[-1] // width)[0]


# --- the terms of a set of cells --------------------------------------------------------------------------------------

@dataclass
class Terms:
    """Every component's part of the target head's q at the query positions and of its k at the key positions; the
    score of cell (i, j) is ``scaling · Σ_a query[a, i] · Σ_b key[b, j]`` (+ the score bias)."""

    query_components: list[Component]
    key_components: list[Component]
    query: torch.Tensor  # (nq, queries, d_head) float64
    key: torch.Tensor  # (nk, keys, d_head)
    queries: list[int]  # positions
    keys: list[int]
    scaling: float
    recorded_query: torch.Tensor  # (queries, d_head): q as the model's scores used it
    recorded_key: torch.Tensor  # (keys, d_head)
    error: float  # the largest |Σ terms − recorded| over q and k, relative to their largest entry
    readers: tuple[Reader, Reader]
    kept: list[Written] = field(default_factory=list)  # the components as written (kept for the intervention check)


TOLERANCE = {torch.float64: 1e-8, torch.float32: 1e-3}  # relative; half precision: HALF_TOLERANCE
HALF_TOLERANCE = 5e-2


def terms(model: nn.Module, cap: Captured, layer: int, head: int, queries: list[int], keys: list[int],
          named: dict | None = None, keep: bool = False) -> Terms:
    """The terms of head ``head`` of ``layer`` at ``queries`` × ``keys`` (positions among ``cap.positions``), checked
    against the q and k the model's scores used."""
    arch = architecture(model)
    where = {position: row for row, position in enumerate(cap.positions)}
    query_rows = torch.tensor([where[p] for p in queries], dtype=torch.int64)
    key_rows = torch.tensor([where[p] for p in keys], dtype=torch.int64)
    read_query = reader(model, arch, cap, layer, "query", head, query_rows)
    read_key = reader(model, arch, cap, layer, "key", head, key_rows)
    norms = stream_norms(arch, cap)
    query_parts, key_parts, components, kept = [], [], [], []
    for part in written(arch, cap, named or {}):
        vectors = propagate(part.vectors, norms[part.stage:])
        query_parts.append(read_query.linear(vectors[:, query_rows]))
        key_parts.append(read_key.linear(vectors[:, key_rows]))
        components += part.components
        if keep:
            kept.append(part)
    query_components, key_components = list(components), list(components)
    for side, read, parts, names, count in (("query", read_query, query_parts, query_components, len(queries)),
                                            ("key", read_key, key_parts, key_components, len(keys))):
        constant = read.constant(count)
        if bool(constant.abs().max() > 0):
            parts.append(constant[None])
            names.append(Component(f"{side}_bias", name=f"{side} bias"))
    query, key = torch.cat(query_parts), torch.cat(key_parts)
    maps, kept_layer = cap.maps, cap.maps_layer
    recorded_query = _host(maps.queries[kept_layer][head][queries])
    recorded_key = _host(maps.keys[kept_layer][head // arch.group][keys])
    error = max(_relative(query.sum(0), recorded_query), _relative(key.sum(0), recorded_key))
    return Terms(query_components, key_components, query, key, list(queries), list(keys),
                 float(maps.scalings[kept_layer]), recorded_query, recorded_key, error, (read_query, read_key), kept)


def _relative(rebuilt: torch.Tensor, recorded: torch.Tensor) -> float:
    return float((rebuilt - recorded).abs().max() / recorded.abs().max().clamp_min(1e-30))


def tolerance(model: nn.Module) -> float:
    return TOLERANCE.get(next(model.parameters()).dtype, HALF_TOLERANCE)


def _row(cap: Captured, block: Block, head: int, query: int, group: int):
    """The row the softmax saw: scores ``(keys,)`` float64 (scaled, with the score bias, before any cap), which
    keys it may see, the score bias, and the weights after softmax (with the soft cap and the sink column when the
    model has them) plus the sink's weight."""
    maps, kept = cap.maps, cap.maps_layer
    q = _host(maps.queries[kept][head][query])
    k = _host(maps.keys[kept][head // group])
    bias = _bias_row(maps, kept, head, query)
    scores = maps.scalings[kept] * (k @ q) + bias
    allowed = torch.from_numpy(np.asarray(maps.row_allowed(kept, query), dtype=bool))
    if not bool(allowed.any()):
        raise ValueError(f"query {query} may see no key at all (a padding position): it has no attention to split")
    shown = scores if block.softcap is None else block.softcap * torch.tanh(scores / block.softcap)
    logits = torch.where(allowed, shown, torch.tensor(-math.inf, dtype=torch.float64))
    sink = None if block.sinks is None else float(block.sinks.detach()[head])
    top = logits.max() if sink is None else torch.maximum(logits.max(), torch.tensor(sink, dtype=torch.float64))
    exp = torch.exp(logits - top)
    total = exp.sum() + (0.0 if sink is None else math.exp(sink - float(top)))
    weights = exp / total
    sink_weight = None if sink is None else math.exp(sink - float(top)) / float(total)
    return scores, allowed, bias, weights, sink_weight


def _bias_row(maps: RecomputedAttention, layer: int, head: int, query: int) -> torch.Tensor:
    keys = len(maps.key_tokens)
    bias = maps.biases[layer] if layer < len(maps.biases) else None
    if bias is None:
        return torch.zeros(keys, dtype=torch.float64)
    if isinstance(bias, RelativeBias):
        values = _host(bias.values)
        values = values[head if values.shape[0] > 1 else 0]
        return values[torch.arange(keys) - query + len(maps.query_tokens) - 1]
    values = _host(bias)
    return values[head if values.shape[0] > 1 else 0, query]


# --- one cell ---------------------------------------------------------------------------------------------------------

TOP_KEYS = 5  # the row's strongest keys a cell's result lists

@dataclass(frozen=True)
class KeyScore:
    position: int
    token: str
    weight: float  # after softmax
    score: float  # before softmax (and before any soft cap)


@dataclass(frozen=True)
class Check:
    """One component taken out of the stream that feeds the target layer's query (or key) only."""

    side: str  # "query" or "key"
    component: str
    predicted: float  # the change the decomposition predicts: minus the component's marginal
    frozen: float  # the change with the component removed and every norm frozen
    recomputed: float | None  # the change with the norms recomputed; None: not in the stream (a projection bias)


@dataclass(frozen=True)
class RopeBands:
    """The score split over RoPE's frequency pairs: pair ``k`` rotates dimensions ``k`` and ``k + d_head / 2`` by
    ``θ_k`` per token (wavelength ``2π / θ_k`` tokens)."""

    contributions: np.ndarray  # (pairs,) score units; they sum to the score before any bias
    frequencies: np.ndarray | None  # (pairs,) θ_k radians per token; None when not found in the model

    @property
    def wavelengths(self) -> np.ndarray | None:
        if self.frequencies is None:
            return None
        with np.errstate(divide="ignore"):
            return 2 * np.pi / self.frequencies


@dataclass(frozen=True)
class PositionShare:
    """Without RoPE: the terms of the score that a position embedding is part of."""

    query_side: float  # query's position embedding × every key component
    key_side: float  # every query component × key's position embedding
    both: float  # position × position (counted in both of the above)
    share: float  # Σ |terms with a position embedding| / Σ |terms|


@dataclass(frozen=True)
class CellWhy:
    """One cell's score split into query-side × key-side component pairs (``contributions[a, b]``, score units)."""

    model: str
    input_name: str
    layer: int
    head: int
    kv_group: int
    query: int
    key: int
    query_token: str
    key_token: str
    score: float  # scaling · q · k + bias, as the softmax saw it (before any soft cap)
    weight: float  # after softmax
    query_components: tuple[str, ...]  # named at the query position ("embedding of ' Paris'")
    key_components: tuple[str, ...]  # named at the key position
    component_kinds: tuple[tuple[str, ...], tuple[str, ...]]  # (query side, key side) Component.kind
    contributions: np.ndarray  # (nq, nk) float64
    score_bias: float  # added to the score besides q · k (0 for every architecture read here but padding masks)
    top_keys: tuple[KeyScore, ...]  # the row's strongest keys, this one among them
    runner_up: KeyScore | None  # the row's strongest key other than this one
    runner_up_contributions: np.ndarray | None  # (nq, nk): the pairs at this key minus at the runner-up
    rope: RopeBands | None
    position: PositionShare | None
    checks: tuple[Check, ...]
    softcap: float | None  # the model caps scores at softcap · tanh(s / softcap): the split is of s before it
    sink_weight: float | None  # the head's sink column's weight in this row (gpt-oss)
    error: float  # |Σ contributions + score bias − score| (score units)
    source: str  # "run": read off the run; "forward": one forward with hooks, stopped at this layer

    @property
    def query_marginal(self) -> np.ndarray:
        """What made the query: each query component's part of the score, summed over key components."""
        return self.contributions.sum(axis=1)

    @property
    def key_marginal(self) -> np.ndarray:
        return self.contributions.sum(axis=0)


def cell(model: nn.Module, cap: Captured, layer: int, head: int, query: int, key: int, labels: list[str],
         named: dict | None = None, check: bool = True, check_pairs: int = 5, model_name: str = "",
         input_name: str = "") -> CellWhy:
    """Cell (``query``, ``key``) of ``head`` in ``layer`` from a capture that holds both positions and the row's
    runner-up key."""
    arch = architecture(model)
    block = arch.blocks[layer]
    scores, allowed, bias, weights, sink_weight = _row(cap, block, head, query, arch.group)
    if not bool(allowed[key]):
        raise ValueError(f"query {query} cannot see key {key} in layer {layer} (the mask hides it): its score never "
                         "reached the softmax. Pick a key the query sees.")
    runner = _runner_up(weights, allowed, key)
    if runner is not None and runner not in cap.positions:
        raise _Missing(runner)
    keys = [key] + ([runner] if runner is not None else [])
    found = terms(model, cap, layer, head, [query], keys, named, keep=check)
    _check_exact(model, found, arch.name)
    contributions = found.scaling * torch.einsum("ae,be->ab", found.query[:, 0], found.key[:, 0])
    score = float(found.scaling * found.recorded_query[0] @ found.recorded_key[0] + bias[key])
    difference = None
    if runner is not None:
        difference = contributions - found.scaling * torch.einsum("ae,be->ab", found.query[:, 0], found.key[:, 1])
    order = torch.argsort(weights, descending=True)[:min(TOP_KEYS, int(allowed.sum()))].tolist()

    def key_score(position: int) -> KeyScore:
        return KeyScore(position, labels[position], float(weights[position]), float(scores[position]))

    kinds = (tuple(c.kind for c in found.query_components), tuple(c.kind for c in found.key_components))
    checks = _checks(arch, cap, found, contributions, check_pairs, labels) if check else ()
    return CellWhy(
        model=model_name, input_name=input_name, layer=layer, head=head, kv_group=head // arch.group, query=query,
        key=key, query_token=labels[query], key_token=labels[key], score=score, weight=float(weights[key]),
        query_components=tuple(c.at(labels[query]) for c in found.query_components),
        key_components=tuple(c.at(labels[key]) for c in found.key_components), component_kinds=kinds,
        contributions=contributions.numpy(), score_bias=float(bias[key]),
        top_keys=tuple(key_score(p) for p in order), runner_up=None if runner is None else key_score(runner),
        runner_up_contributions=None if difference is None else difference.numpy(),
        rope=_bands(model, cap, found) if cap.cos is not None else None,
        position=_position_share(contributions, kinds) if cap.cos is None else None, checks=checks,
        softcap=block.softcap, sink_weight=sink_weight,
        error=abs(float(contributions.sum()) + float(bias[key]) - score), source=cap.source)



def _runner_up(weights: torch.Tensor, allowed: torch.Tensor, key: int, skip: tuple[int, ...] = ()) -> int | None:
    """The row's strongest key other than ``key`` (and ``skip``), or None when it sees no other."""
    candidates = weights.clone()
    candidates[~allowed] = -1.0
    candidates[key] = -1.0
    for position in skip:
        candidates[position] = -1.0
    best = int(torch.argmax(candidates))
    return None if candidates[best] < 0 else best


def _check_exact(model: nn.Module, found: Terms, name: str) -> None:
    if found.error > tolerance(model):
        raise _Inexact(f"The decomposition could not rebuild this layer's queries and keys from its residual stream "
                         f"(off by {found.error:.1e} of their size): this {name} model computes them in a way the "
                         "decomposition does not know. It refuses rather than show a split that does not add up.")


def _bands(model: nn.Module, cap: Captured, found: Terms) -> RopeBands:
    q, k = found.recorded_query[0], found.recorded_key[0]
    half = q.shape[-1] // 2
    products = found.scaling * q * k
    contributions = (products[:half] + products[half:]).numpy()
    return RopeBands(contributions, _frequencies(model, cap, half))


def _frequencies(model: nn.Module, cap: Captured, half: int) -> np.ndarray | None:
    """θ_k per frequency pair (radians per token) of the RoPE the target layer used: the model's ``inv_freq`` buffer
    whose angles match the (cos, sin) the layer received at the furthest position captured."""
    row = int(np.argmax(cap.positions))
    position = cap.positions[row]
    angles = torch.atan2(cap.sin[row, :half], cap.cos[row, :half])
    for name, buffer in model.named_buffers():
        if "inv_freq" not in name or buffer.numel() != half:
            continue
        frequencies = _host(buffer).flatten()
        wrapped = torch.remainder(position * frequencies - angles + math.pi, 2 * math.pi) - math.pi
        if float(wrapped.abs().max()) < 1e-3:
            return frequencies.numpy()
    return None


def _position_share(contributions: torch.Tensor, kinds) -> PositionShare | None:
    query_position = torch.tensor([kind == "position" for kind in kinds[0]])
    key_position = torch.tensor([kind == "position" for kind in kinds[1]])
    if not bool(query_position.any() or key_position.any()):
        return None
    touching = query_position[:, None] | key_position[None, :]
    total = float(contributions.abs().sum())
    return PositionShare(float(contributions[query_position].sum()), float(contributions[:, key_position].sum()),
                         float(contributions[query_position][:, key_position].sum()),
                         float(contributions[touching].abs().sum()) / total if total else 0.0)


def _checks(arch: Architecture, cap: Captured, found: Terms, contributions: torch.Tensor, pairs: int,
            labels: list[str]) -> tuple[Check, ...]:
    """Take each component of the ``pairs`` largest pairs out of the stream that feeds the target layer's query (or
    key) only, and see the score move: with every norm frozen (by exactly its term), and with the norms recomputed."""
    flat = torch.argsort(contributions.abs().flatten(), descending=True)[:pairs].tolist()
    width = contributions.shape[1]
    chosen = {("query", index // width): None for index in flat}
    chosen.update({("key", index % width): None for index in flat})
    norms = stream_norms(arch, cap)
    sites = _norm_sites(arch, cap)
    vectors, stages = [], []
    for part in found.kept:
        vectors.append(part.vectors)
        stages += [part.stage] * len(part.components)
    raw = torch.cat(vectors)  # (n, P, d) as written
    where = {position: row for row, position in enumerate(cap.positions)}
    read_query, read_key = found.readers
    q, k = found.recorded_query[0], found.recorded_key[0]
    done = []
    for side, index in chosen:
        read = read_query if side == "query" else read_key
        row = where[found.queries[0] if side == "query" else found.keys[0]]
        component = (found.query_components if side == "query" else found.key_components)[index]
        marginal = contributions[index].sum() if side == "query" else contributions[:, index].sum()
        other = k if side == "query" else q
        if component.kind in ("query_bias", "key_bias"):  # not in the stream: only the frozen check applies
            done.append(Check(side, component.name, -float(marginal), -float(marginal), None))
            continue
        read = read.only(0)  # the cell's own key, not the runner-up
        stream = cap.x[row]
        vector = propagate(raw[index][None], norms[stages[index]:])[0, row]
        linear = read.linear(stream[None, None])[0, 0]
        frozen_change = found.scaling * float((read.linear((stream - vector)[None, None])[0, 0] - linear) @ other)
        removed = _recompute_removal(raw[index][row], stages[index], sites, row) if norms else vector
        base = read.recomputed(stream[None])[0]
        recomputed = found.scaling * float((read.recomputed((stream - removed)[None])[0] - base) @ other)
        name = component.at(labels[found.queries[0] if side == "query" else found.keys[0]])
        done.append(Check(side, name, -float(marginal), frozen_change, recomputed))
    return tuple(done)


def _norm_sites(arch: Architecture, cap: Captured) -> list[tuple[nn.Module, torch.Tensor, torch.Tensor]]:
    """The stream norms of a post-norm model with their (input, output) at the positions, in order."""
    if not arch.post_norm:
        return []
    sites = [(arch.embedding_norm, *cap.embedding_norm)]
    for number, layer in enumerate(cap.layers):
        block = arch.blocks[number]
        sites += [(block.attention_norm, *layer.attention_norm), (block.output_norm, *layer.output_norm)]
    return sites


def _recompute_removal(vector: torch.Tensor, stage: int, sites: list, row: int) -> torch.Tensor:
    """How much the stream entering the target layer changes at one position when a component written before the
    stream norm ``stage`` is taken out and every norm after it recomputes its scale (post-norm models)."""
    change = vector
    for module, inputs, outputs in sites[stage:]:
        parameter = next(module.parameters())
        with torch.inference_mode():
            again = _host(module((inputs[row] - change).to(parameter.device, parameter.dtype)))
        change = outputs[row] - again
    return change


# --- a whole head: which components feed its keys and its queries -----------------------------------------------------

@dataclass(frozen=True)
class HeadWhy:
    """What feeds one head's queries and keys over a set of its cells (K- and Q-composition, averaged over cells).

    ``key_side[c]``: mean over the cells of component ``c``'s part of the score through the key (its key-side
    marginal); ``key_vs_runner_up[c]``: the same at the cell's key minus at its row's runner-up key (why that key
    and not the next); likewise for the query side. Shares divide by the mean score (the mean margin over the
    runner-up), so over every component each column's shares sum to 1 (bias terms included)."""

    model: str
    input_name: str
    layer: int
    head: int
    kv_group: int
    cells: tuple[tuple[int, int], ...]  # (query, key)
    runner_ups: tuple[int | None, ...]
    scores: np.ndarray  # (cells,) each cell's score
    margins: np.ndarray  # (cells,) score − the runner-up's (NaN without one)
    components: tuple[str, ...]
    kinds: tuple[str, ...]
    component_layers: np.ndarray  # (components,) -1 for embeddings and biases
    component_heads: np.ndarray  # (components,) -1 for anything but a head
    query_side: np.ndarray  # (components,) mean score units
    key_side: np.ndarray
    query_vs_runner_up: np.ndarray
    key_vs_runner_up: np.ndarray
    selection: str  # how the cells were chosen, in words
    error: float
    source: str

    @property
    def mean_score(self) -> float:
        return float(self.scores.mean())

    @property
    def mean_margin(self) -> float:
        margins = self.margins[np.isfinite(self.margins)]
        return float(margins.mean()) if len(margins) else float("nan")

    def share(self, column: str) -> np.ndarray:
        """``column`` ("key_side", "query_vs_runner_up", …) as a share of the mean score (or margin)."""
        values = getattr(self, column)
        total = self.mean_margin if column.endswith("runner_up") else self.mean_score
        return values / total if total and np.isfinite(total) else np.full_like(values, np.nan)


def head_table(model: nn.Module, cap: Captured, layer: int, head: int, cells: list[tuple[int, int]],
               runner_ups: list[int | None], named: dict | None = None, selection: str = "", model_name: str = "",
               input_name: str = "") -> HeadWhy:
    """The composition table of ``head`` in ``layer`` over ``cells`` (each with its row's runner-up key or None)."""
    arch = architecture(model)
    queries = sorted({i for i, _ in cells})
    keys = sorted({j for _, j in cells} | {j for j in runner_ups if j is not None})
    found = terms(model, cap, layer, head, queries, keys, named)
    _check_exact(model, found, arch.name)
    row_of = {p: r for r, p in enumerate(queries)}
    column_of = {p: r for r, p in enumerate(keys)}
    query_rows = torch.tensor([row_of[i] for i, _ in cells])
    key_rows = torch.tensor([column_of[j] for _, j in cells])
    q, k = found.query.sum(0), found.key.sum(0)  # (queries, d_head), (keys, d_head)
    scaling = found.scaling
    query_parts = scaling * torch.einsum("acd,cd->ac", found.query[:, query_rows], k[key_rows])  # (nq, cells)
    key_parts = scaling * torch.einsum("cd,bcd->bc", q[query_rows], found.key[:, key_rows])  # (nk, cells)
    maps, kept = cap.maps, cap.maps_layer
    bias = torch.stack([_bias_row(maps, kept, head, i)[j] for i, j in cells])
    scores = query_parts.sum(0) + bias
    has_runner = [j is not None for j in runner_ups]
    margins = torch.full((len(cells),), float("nan"), dtype=torch.float64)
    query_vs = torch.zeros(len(found.query_components), dtype=torch.float64)
    key_vs = torch.zeros(len(found.key_components), dtype=torch.float64)
    if any(has_runner):
        chosen = torch.tensor([c for c, ok in enumerate(has_runner) if ok])
        runner_rows = torch.tensor([column_of[j] for j in runner_ups if j is not None])
        other_bias = torch.stack([_bias_row(maps, kept, head, cells[c][0])[runner_ups[c]] for c in chosen.tolist()])
        own_k, other_k = k[key_rows[chosen]], k[runner_rows]
        query_difference = scaling * torch.einsum("acd,cd->ac", found.query[:, query_rows[chosen]], own_k - other_k)
        key_difference = scaling * torch.einsum(
            "cd,bcd->bc", q[query_rows[chosen]], found.key[:, key_rows[chosen]] - found.key[:, runner_rows])
        margins[chosen] = query_difference.sum(0) + bias[chosen] - other_bias
        query_vs, key_vs = query_difference.mean(1), key_difference.mean(1)
    components, query_side, key_side, qv, kv = _union(found, query_parts.mean(1), key_parts.mean(1), query_vs, key_vs)
    recorded = scaling * (found.recorded_query[query_rows] * found.recorded_key[key_rows]).sum(-1) + bias
    return HeadWhy(
        model=model_name, input_name=input_name, layer=layer, head=head, kv_group=head // arch.group,
        cells=tuple((int(i), int(j)) for i, j in cells), runner_ups=tuple(runner_ups), scores=recorded.numpy(),
        margins=margins.numpy(), components=tuple(c.name for c in components), kinds=tuple(c.kind for c in components),
        component_layers=np.array([c.layer for c in components]),
        component_heads=np.array([c.head for c in components]),
        query_side=query_side, key_side=key_side, query_vs_runner_up=qv, key_vs_runner_up=kv, selection=selection,
        error=float((scores - recorded).abs().max()), source=cap.source)


def _union(found: Terms, query_side, key_side, query_vs, key_vs):
    """One row per component: the stream components (both sides), then the query bias (query side only) and the key
    bias (key side only)."""
    components, columns = [], {name: [] for name in ("q", "k", "qv", "kv")}
    key_index = {component: index for index, component in enumerate(found.key_components)}
    for index, component in enumerate(found.query_components):
        components.append(component)
        other = key_index.pop(component, None)
        columns["q"].append(float(query_side[index]))
        columns["qv"].append(float(query_vs[index]))
        columns["k"].append(0.0 if other is None else float(key_side[other]))
        columns["kv"].append(0.0 if other is None else float(key_vs[other]))
    for component, index in key_index.items():  # the key bias
        components.append(component)
        columns["q"].append(0.0)
        columns["qv"].append(0.0)
        columns["k"].append(float(key_side[index]))
        columns["kv"].append(float(key_vs[index]))
    return (components, *(np.array(columns[name]) for name in ("q", "k", "qv", "kv")))


# --- from a page's run ------------------------------------------------------------------------------------------

def why_cell(loaded, result: RunResult, options) -> CellWhy:
    """The Why view's analysis: cell (``options.query``, ``options.key``) of ``options.head`` in ``options.layer``
    (query None: the last token of a language model, [CLS] elsewhere; key None: the row's strongest key)."""
    model = loaded.model
    architecture(model)  # an architecture it cannot split is refused before any work
    maps = result.maps("self")
    layer, head = _layer_head(maps, options.layer, options.head)
    count = len(maps.query_tokens)
    query = default_query(result) if options.query is None else int(options.query)
    if not 0 <= query < count:
        raise ValueError(f"query {query} does not exist: the input has positions 0..{count - 1}")
    weights = np.asarray(maps.row(layer, head, query), dtype=np.float64)
    key = int(np.argmax(weights)) if options.key is None else int(options.key)
    if not 0 <= key < len(maps.key_tokens):
        raise ValueError(f"key {key} does not exist: the input has positions 0..{len(maps.key_tokens) - 1}")
    strongest = np.argsort(weights)[::-1][:3].tolist()
    positions = sorted({query, key, *strongest})
    labels, named = _labels(result), _named(loaded, result)
    common = dict(named=named, check=bool(getattr(options, "check", True)), model_name=result.model.short_name,
                  input_name=result.input_name)
    cap = _capture(loaded, result, layer, positions)
    while True:
        try:
            return cell(model, cap, layer, head, query, key, labels, **common)
        except _Missing as missing:  # the capture's own row ranks another runner-up first (a sink, a soft cap)
            positions = sorted(set(positions) | {missing.position})
            cap = _capture(loaded, result, layer, positions, forward=cap.source == "forward")
        except _Inexact:
            if cap.source != "run":
                raise
            cap = _capture(loaded, result, layer, positions, forward=True)


def why_head(loaded, result: RunResult, options) -> HeadWhy:
    """The Why view's whole-head analysis: over a window of rows (``options.first`` .. ``+ options.rows``; first
    None: the last rows), each row's strongest key (the first token left out when ``options.skip_first``), the
    ``options.cells`` strongest of those cells, each against its row's runner-up key."""
    model = loaded.model
    architecture(model)
    maps = result.maps("self")
    layer, head = _layer_head(maps, options.layer, options.head)
    count = len(maps.query_tokens)
    rows = max(1, int(options.rows))
    first = max(0, count - rows) if options.first is None else int(options.first)
    if not 0 <= first < count:
        raise ValueError(f"the first row {first} does not exist: the input has positions 0..{count - 1}")
    window = range(first, min(count, first + rows))
    skip = (0,) if options.skip_first else ()
    picked = []
    for query in window:
        weights = np.asarray(maps.row(layer, head, query), dtype=np.float64)
        allowed = np.asarray(maps.row_allowed(layer, query), dtype=bool)
        order = [int(p) for p in np.argsort(weights)[::-1] if allowed[p] and (p not in skip or allowed.sum() == 1)]
        if not order:
            continue
        runner = order[1] if len(order) > 1 else None
        picked.append((float(weights[order[0]]), query, order[0], runner))
    picked = sorted(picked, reverse=True)[:max(1, int(options.cells))]
    if not picked:
        raise ValueError("no row of the window sees a key besides the first token: widen the window")
    cells = [(query, key) for _, query, key, _ in sorted(picked, key=lambda item: item[1])]
    runners = [runner for _, _, _, runner in sorted(picked, key=lambda item: item[1])]
    selection = (f"each row {window.start}–{window.stop - 1}'s strongest key" + (" (the first token left out)"
                 if skip else "") + f", the {len(cells)} strongest of those cells, each against its row's runner-up")
    positions = sorted({p for cell_ in cells for p in cell_} | {j for j in runners if j is not None})
    named = _named(loaded, result)
    cap = _capture(loaded, result, layer, positions)
    common = dict(named=named, selection=selection, model_name=result.model.short_name,
                  input_name=result.input_name)
    try:
        return head_table(model, cap, layer, head, cells, runners, **common)
    except _Inexact:
        if cap.source != "run":
            raise
        return head_table(model, _capture(loaded, result, layer, positions, forward=True), layer, head, cells,
                          runners, **common)


class _Missing(Exception):
    def __init__(self, position: int):
        super().__init__(position)
        self.position = position


class _Inexact(ValueError):
    """The stream did not rebuild the recorded q and k (the message says by how much)."""


def _layer_head(maps, layer: int, head: int) -> tuple[int, int]:
    if not 0 <= int(layer) < maps.num_layers:
        raise ValueError(f"layer {layer} does not exist: this model has layers 0..{maps.num_layers - 1}")
    if not 0 <= int(head) < maps.num_heads:
        raise ValueError(f"head {head} does not exist: this layer has heads 0..{maps.num_heads - 1}")
    return int(layer), int(head)


def default_query(result: RunResult) -> int:
    """The row the Why view opens on: a language model's last token (what predicts the next one), else the first
    ([CLS] of an encoder or a ViT)."""
    if isinstance(result, TextResult) and (result.next_token or result.generation):
        return len(result.tokens) - 1
    return 0


def _labels(result: RunResult) -> list[str]:
    pieces = getattr(result, "pieces", ())
    if pieces and len(pieces) == len(result.tokens):
        from models.core.text import visible_text

        return [visible_text(piece) for piece in pieces]
    return list(result.tokens)


def _capture(loaded, result: RunResult, layer: int, positions: list[int], forward: bool = False) -> Captured:
    model = loaded.model
    if not forward and from_run_possible(model, result, layer):
        return capture_run(model, result, layer, positions)
    return capture_forward(model, _forward_of(loaded, result), layer, positions, 0, _labels(result))


def _forward_of(loaded, result: RunResult) -> Callable[[], object]:
    """A forward of ``loaded.model`` on exactly the input ``result`` was made from."""
    import inspect

    model = loaded.model
    arch = architecture(model)
    parameter = next(model.parameters())
    if isinstance(result, TextResult):
        if not result.token_ids or len(result.token_ids) != len(result.tokens):
            raise ValueError("this run did not keep its token ids, so the decomposition cannot re-read it")
        ids = torch.tensor([list(result.token_ids)], device=parameter.device)
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if arch.name not in ENCODERS:
            kwargs["use_cache"] = False
            if "logits_to_keep" in inspect.signature(model.forward).parameters:
                kwargs["logits_to_keep"] = 1
        return lambda: model(**kwargs)
    image = getattr(result, "image", None)
    config = getattr(loaded, "data_config", None)
    if image is None or config is None:
        raise ValueError(f"the decomposition reads text and image runs, not a {type(result).__name__}")
    from models.analysis.pixels import normalised

    pixels = normalised(image.image, config).to(parameter.device, parameter.dtype)
    if arch.embedding == "timm":
        return lambda: model.forward_features(pixels)
    return lambda: model(pixel_values=pixels)


_ROLES: "memo.PerObject[dict]" = memo.PerObject()  # per model, for its lifetime


def _named(loaded, result: RunResult) -> dict[tuple[int, int], str]:
    """Each head's role in words for a causal LM (``models.analysis.roles``: one forward of 2 × 65 tokens, a property
    of the model, kept beside it like ``sites.of``); none for other families."""
    if not (isinstance(result, TextResult) and (result.next_token or result.generation)):
        return {}
    from models.analysis.roles import head_roles

    return _ROLES.get(loaded.model, lambda: role_names(head_roles(loaded).scores))
