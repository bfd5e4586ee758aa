"""The mixture-of-experts page's rows of the support matrix (tests/support_matrix.py, ``OTHER_PAGES``): a tiny
random model of every MoE architecture transformers lists (causal LMs, and the encoder–decoders Switch and NLLB-MoE),
saved to a folder, typed into the page, and its routing and attention compared with the same folder run by
transformers' eager attention.

    python -m tests.support_matrix --page=moe                 # every MoE architecture
    python -m tests.support_matrix --page=moe mixtral gpt_oss

What is compared, per MoE layer and token:

- **dispatch**: the experts the page says each token went to and the weights it says they were given, against what
  the model's own expert modules were handed in the eager run (a forward pre-hook on each ``experts`` module reads
  its arguments: the chosen experts and their weights, Switch's capacity-cut one-hot and probability, or Llama 4's
  inputs already scaled by the weights), as ``(tokens, experts)`` matrices of weights;
- **router probabilities**: the page's probabilities against the router logits transformers returns with
  ``output_router_logits=True``, turned into probabilities by the rule the page says the model uses;
- **attention**: every layer's map of the page's forward (``capture.recording`` around the page's own run, the
  capture path or the eager path the page's load chose) against ``output_attentions=True`` of eager attention.

The MoE page draws no attention itself; its forward is what the routing of every layer after the first depends on,
which is why its maps are compared too (DeepSeek-V4's forward under capture once differed from eager's by 0.6 in
the logits, and the page routed that forward). What the page cannot read it must refuse in words naming the
architecture, when the model loads (a router returning something else, weights no rule explains, no router).

A tiny model keeps a dense layer beside its MoE layers where the architecture has both, and its routers are drawn
with logits of unit scale (``_spread_routers``): a fresh router's near-equal logits would make the comparison of
which experts were chosen a matter of rounding.
"""
from __future__ import annotations

import copy
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from tests import support_matrix
from tests.support_matrix import Outcome

PAGE = "moe"
MAPPINGS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES")
WEIGHT_TOLERANCE = 1e-5  # dispatched weights and router probabilities, float32
ROUTER_NAMES = ("gate", "router")

# where a tiny model of an architecture needs more than the generic shrinking to route at all (an MoE layer among
# its kept layers, experts switched on)
LINEAR_ATTENTION = {"linear_num_heads": 4, "linear_head_dim": 16}  # the linear-attention layers' own sizes
OVERRIDES: dict[str, dict] = {
    "gemma4_text": {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32},
    "doge": {"is_moe": True},
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},  # None by default
    "lfm2_moe": {"num_dense_layers": 1, "layer_types": ["conv", "full_attention"]},
    "bailing_hybrid": {"num_expert_group": 1, **LINEAR_ATTENTION},  # 8 groups of the tiny model's 4 experts
    "kimi_linear": LINEAR_ATTENTION,
    "longcat_flash": {"zero_expert_num": 1, "expert_ffn_hidden_size": 32},
    "hunyuan_v1_moe": {"head_dim": 16},  # None by default
}
# config fields that keep the first layers dense or put MoE layers only every n-th layer: one dense layer is kept
# (the page must tell the two apart) and the rest are MoE
MOE_FROM_LAYER = {"first_k_dense_replace": 1, "moe_layer_start_index": 1, "decoder_sparse_step": 1,
                  "encoder_sparse_step": 2, "moe_layer_freq": 1, "interleave_moe_layer_step": 1,
                  "mlp_only_layers": [0]}


def _keys(values: dict):
    for key, value in values.items():
        yield str(key)
        if isinstance(value, dict):
            yield from _keys(value)


def architectures(page: str) -> list[str]:
    """Every architecture of the causal-LM and sequence-to-sequence auto mappings whose config speaks of experts."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    found = set()
    for mapping in MAPPINGS:
        for model_type in getattr(modeling_auto, mapping):
            try:
                values = CONFIG_MAPPING[model_type]().to_dict()
            except Exception:  # noqa: BLE001 - a config that cannot be made with its defaults is not listed
                continue
            if any("expert" in key.lower() or "moe" in key.lower() for key in _keys(values)):
                found.add(model_type)
    return sorted(found)


# --- building ------------------------------------------------------------------------------------------------------

def _model_class(model_type: str):
    import transformers
    from transformers.models.auto import modeling_auto

    for mapping in MAPPINGS:
        names = getattr(modeling_auto, mapping)
        if model_type in names:
            name = names[model_type]
            name = name[0] if isinstance(name, (list, tuple)) else name
            return getattr(transformers, name, None), name
    raise LookupError(f"{model_type} is in no causal-LM or sequence-to-sequence mapping")


def tiny_moe_config(model_type: str):
    """``support_matrix.tiny_config`` with MoE layers where the architecture would keep its first ones dense."""
    config = support_matrix.tiny_config(model_type)
    for target in {id(config): config, id(_text(config)): _text(config)}.values():
        for name, value in {**MOE_FROM_LAYER, **OVERRIDES.get(model_type, {})}.items():
            if hasattr(target, name):
                setattr(target, name, copy.deepcopy(value))
        if isinstance(getattr(target, "moe_layers", None), list):  # Llama 4: the MoE layers by number
            target.moe_layers = list(range(1, getattr(target, "num_hidden_layers", 2)))
    return config


def _text(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def moe_blocks(model) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every module with an ``experts`` child, in model order."""
    return [(name, module) for name, module in model.named_modules() if "experts" in dict(module.named_children())]


@torch.no_grad()
def _spread_routers(model) -> None:
    """Router weights drawn so that logits have unit scale, and choice biases spread (DeepSeek's score correction):
    a fresh router's logits differ by less than the rounding between two attention implementations."""
    generator = torch.Generator().manual_seed(1)
    for _, block in moe_blocks(model):
        for child_name, child in block.named_children():
            if not any(part in child_name for part in ROUTER_NAMES) or child_name == "experts":
                continue
            tensors = [*child.named_parameters(), *child.named_buffers()]
            for name, tensor in tensors:
                if not tensor.is_floating_point():
                    continue
                if tensor.dim() == 2:
                    tensor.copy_(torch.randn(tensor.shape, generator=generator) / tensor.shape[1] ** 0.5)
                elif tensor.dim() == 1 and "bias" in name:
                    tensor.copy_(torch.linspace(-0.5, 0.5, tensor.numel()))


def build(model_type: str, folder: Path) -> str:
    """Save a seeded tiny random MoE model of ``model_type`` and the MiniLM tokenizer to ``folder``; returns the
    class name."""
    from tests.conftest import minilm_tokenizer

    config = tiny_moe_config(model_type)
    model_class, name = _model_class(model_type)
    if model_class is None:
        raise LookupError(f"transformers has no class {name}")
    with torch.device("meta"):
        meta = model_class._from_config(copy.deepcopy(config))
    parameters = sum(p.numel() for p in meta.parameters())
    if parameters > support_matrix.MAX_PARAMETERS:
        raise LookupError(f"{parameters / 1e6:.0f} M parameters after shrinking (the harness missed a size)")
    torch.manual_seed(0)
    model = model_class._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    _spread_routers(model)
    ids = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102]])
    extra = {"decoder_input_ids": ids[:, :3]} if getattr(config, "is_encoder_decoder", False) else {}
    try:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False, **extra)
    except Exception as error:
        raise LookupError(f"the tiny model does not run in eager: {type(error).__name__}: "
                          f"{str(error).splitlines()[0][:160] if str(error) else ''}") from error
    model.save_pretrained(folder)
    minilm_tokenizer().save_pretrained(folder)
    return name


# --- the reference: what the model's own experts were handed ----------------------------------------------------

class _Dispatch:
    """Pre-hooks on an eager model's MoE blocks and their ``experts``: per block, the block's input and the
    arguments its experts were called with."""

    def __init__(self, model):
        self.inputs: dict[str, torch.Tensor] = {}
        self.calls: dict[str, tuple] = {}
        self.handles = []
        for name, block in moe_blocks(model):
            self.handles.append(block.register_forward_pre_hook(self._block(name), with_kwargs=True))
            self.handles.append(block.experts.register_forward_pre_hook(self._experts(name), with_kwargs=True))

    def _block(self, name):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states")
            self.inputs[name] = hidden.detach().reshape(-1, hidden.shape[-1]).float().clone()
        return hook

    def _experts(self, name):
        def hook(module, args, kwargs):
            self.calls[name] = tuple(a.detach().clone() if torch.is_tensor(a) else a
                                     for a in (*args, *kwargs.values()))
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()

    def sent(self, name: str, experts: int) -> torch.Tensor:
        """``(tokens, experts)`` float32: the weight each token's input or output was given for each expert (0 where
        it was not sent) by the call of block ``name``'s experts."""
        call = self.calls.get(name)
        if call is None:
            raise AssertionError(f"{name}'s experts were never called")
        tensors = [a for a in call if torch.is_tensor(a)]
        if len(tensors) >= 3 and not tensors[1].is_floating_point() and tensors[2].is_floating_point() and \
                tensors[1].shape == tensors[2].shape:  # (hidden, chosen experts (T, k), their weights (T, k))
            index, weights = tensors[1].reshape(-1, tensors[1].shape[-1]), tensors[2]
            weights = weights.reshape(index.shape).float()
            dense = torch.zeros(index.shape[0], experts)
            return dense.scatter_add_(1, index.long(), weights)
        if len(tensors) >= 3 and tensors[1].shape[-1] == experts:  # Switch: capacity-cut one-hot, probability
            mask = tensors[1].reshape(-1, experts).float()
            return mask * tensors[2].reshape(mask.shape[0], -1).float()
        if len(tensors) == 1 and name in self.inputs:  # Llama 4: every expert's input, scaled by its weight
            hidden = self.inputs[name]  # (T, H)
            scaled = tensors[0].float().reshape(experts, hidden.shape[0], hidden.shape[1])  # (E, T, H)
            weights = (scaled * hidden[None]).sum(-1) / (hidden * hidden).sum(-1).clamp_min(1e-30)  # (E, T)
            if float((scaled - weights[..., None] * hidden[None]).abs().max()) > 1e-5:
                raise AssertionError(f"{name}'s experts were handed inputs that are no scaled copies of the tokens")
            return weights.T.contiguous()
        shapes = [tuple(t.shape) for t in tensors]
        raise AssertionError(f"{name}'s experts were called with tensors of shapes {shapes}, which this harness "
                             "does not read")


def _reference(folder: Path, ids: list[int], encoder_decoder: bool):
    """(eager model output, ``_Dispatch``) of the folder run by transformers' eager attention on ``ids``."""
    import transformers

    auto = transformers.AutoModelForSeq2SeqLM if encoder_decoder else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    dispatch = _Dispatch(model)
    input_ids = torch.tensor([ids])
    arguments = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "output_attentions": True}
    runner = model.get_encoder() if encoder_decoder else model
    try:
        with torch.inference_mode():
            try:
                output = runner(**arguments, output_router_logits=True, **({} if encoder_decoder else
                                                                           {"use_cache": False}))
            except TypeError:  # a model that does not take the argument: its routing is still read from its experts
                output = runner(**arguments, **({} if encoder_decoder else {"use_cache": False}))
    finally:
        dispatch.remove()
    return output, dispatch


def _router_logits(output) -> list[torch.Tensor]:
    """The router logits transformers returned, one ``(tokens, experts)`` tensor per MoE layer (empty when none)."""
    found = getattr(output, "router_logits", None) or getattr(output, "encoder_router_logits", None) or ()
    tensors = []
    for entry in found:
        if isinstance(entry, (tuple, list)):  # Switch: (logits, chosen experts)
            entry = entry[0]
        if torch.is_tensor(entry) and entry.is_floating_point():
            tensors.append(entry.reshape(-1, entry.shape[-1]).float())
    return tensors


# --- the page against the reference ---------------------------------------------------------------------------

def check(page: str, model_type: str, workdir: Path) -> Outcome:
    from models import families
    from models.core import capture
    from models.core.inputs import TextInput

    outcome = Outcome(page, model_type)
    started = time.perf_counter()
    folder = workdir / f"{page}-{model_type}"
    try:
        outcome.architecture = build(model_type, folder)
    except Exception as error:  # noqa: BLE001 - the harness's own failure, reported as "not built"
        outcome.message = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        outcome.seconds = time.perf_counter() - started
        return outcome
    try:
        loaded = families.load(families.custom(page, str(folder)), "cpu", "float32")
        with capture.recording(loaded.model) as recorder:
            result = families.run(loaded, TextInput(support_matrix.TEXT, 64))
        outcome.path = loaded.capture
        eager_path = capture.on_eager_path(loaded.model)
    except ValueError as error:
        outcome.status, outcome.message = "refused", str(error)
        if model_type not in str(error).replace(str(folder), ""):  # the folder's name does not count
            outcome.status, outcome.message = "crash", f"refused without naming {model_type}: {error}"
        outcome.seconds = time.perf_counter() - started
        return outcome
    except Exception as error:  # noqa: BLE001 - a crash is what the matrix exists to find
        outcome.status = "crash"
        outcome.message = f"{type(error).__name__}: {error}"[:500] + "\n" + traceback.format_exc(limit=-3)[-1500:]
        outcome.seconds = time.perf_counter() - started
        return outcome
    encoder_decoder = bool(getattr(loaded.model.config, "is_encoder_decoder", False))
    kind = "encoder" if encoder_decoder else "self"
    try:
        try:
            maps = recorder.attention_maps(kind, 0) if kind in recorder.kinds() else None
        except ValueError as error:  # maps no page can draw (compressed blocks of keys): the routing still is
            maps, unmapped = None, str(error)
        else:
            unmapped = ""
        outcome.kinds = [kind] if maps is not None else []
        del loaded  # one copy of the weights at a time
        routing = result.routing
        output, dispatch = _reference(folder, list(routing.token_ids), encoder_decoder)
        worst = _routing_difference(routing, dispatch, output)
        if maps is not None:
            attentions = getattr(output, "attentions", None)
            reference = support_matrix._softmax_maps(attentions, model_type in capture.BANDED)
            reference = {n: m for n, m in reference.items() if m.shape[-1] == len(routing.token_ids)}
            worst = max(worst, support_matrix._worst(maps, reference))
            outcome.layers = maps.num_layers
        elif getattr(output, "attentions", None) and not unmapped:
            raise AssertionError("eager returned attention maps; the page's forward recorded none")
        outcome.max_difference = worst
        exact = worst <= WEIGHT_TOLERANCE
        outcome.status = ("exact (eager path)" if eager_path else "exact") if exact else "wrong"
        outcome.message = f"{routing.num_layers} MoE layers: {routing.dispatch_rule()}" + (
            f". Attention not compared: {unmapped}" if unmapped else "")
    except Exception as error:  # noqa: BLE001
        outcome.status = "wrong"
        outcome.message = f"compared with eager: {type(error).__name__}: {error}"[:500]
    outcome.seconds = time.perf_counter() - started
    return outcome


def _routing_difference(routing, dispatch: _Dispatch, output) -> float:
    """The largest difference between the page's routing and the eager model's own, over every MoE layer: dispatched
    weights as ``(tokens, experts)`` matrices, and probabilities against the router logits transformers returned;
    an ``AssertionError`` when the layers do not pair up."""
    blocks = [name.rsplit(".", 1)[0] for name in routing.layer_names]
    called = [name for name in dispatch.calls]
    if routing.stack == "encoder":
        called = [name for name in called if ".decoder." not in f".{name}." and not name.startswith("decoder.")]
    if blocks != called:
        raise AssertionError(f"the page routed {blocks}; the model's experts were called in {called}")
    tokens, experts = len(routing.token_ids), routing.num_experts
    worst = 0.0
    for layer, name in enumerate(blocks):
        sent = dispatch.sent(name, experts)
        if sent.shape != (tokens, experts):
            raise AssertionError(f"{name}: the experts were sent {tuple(sent.shape)}, the page routed "
                                 f"{(tokens, experts)}")
        drawn = torch.zeros(tokens, experts)
        weights = torch.from_numpy(np.where(routing.kept[layer], routing.top_weights[layer], 0.0).astype(np.float32))
        drawn.scatter_add_(1, torch.from_numpy(np.array(routing.top_experts[layer], np.int64)), weights)
        worst = max(worst, float((drawn - sent).abs().max()))
    logits = _router_logits(output)

    def difference(layer: int, values: torch.Tensor) -> float:
        scores = _scores(values, routing.score_function)
        expected = (scores / scores.sum(-1, keepdim=True)).numpy()
        return float(np.abs(routing.probs[layer] - expected).max()) if expected.shape == routing.probs[
            layer].shape else float("inf")

    if len(logits) == len(blocks):
        for layer, values in enumerate(logits):
            worst = max(worst, difference(layer, values))
    elif logits:  # some routers are not recorded (DeepSeek-V4's hash-routed layers): each returned one, in order
        unmatched = list(logits)
        for layer in range(len(blocks)):
            if unmatched and difference(layer, unmatched[0]) <= WEIGHT_TOLERANCE:
                worst = max(worst, difference(layer, unmatched.pop(0)))
        if unmatched:
            raise AssertionError(f"transformers returned router logits of {len(logits)} layers; "
                                 f"{len(unmatched)} of them match none of the page's {len(blocks)} layers in order")
    return worst


def _scores(logits: torch.Tensor, name: str) -> torch.Tensor:
    """Per-expert scores by the named function, as transformers computes it (softmax over experts, or the
    activation of that name on each logit)."""
    from transformers.activations import ACT2FN

    return torch.softmax(logits, -1) if name == "softmax" else ACT2FN[name](logits)
