"""A model a notebook user already holds, borrowed for one call and handed back exactly as it was found.

The app loads its own models with the capture attention function (``models/core/loading.py``). A researcher's model
is already in memory, in their dtype and on their device, loaded with whatever attention implementation they chose,
perhaps in training mode, with gradients on and hooks of their own. ``borrowed(model, prepare)`` takes a snapshot of
everything a run could change, switches the model to what capture needs (``prepare``: the "capture" attention
function of ``models/core/capture.py`` for transformers, unfused attention for timm; eval mode; no gradients kept),
and on exit, however the block ends (an error, a ``KeyboardInterrupt``), puts every item back:

- each transformers config's attention implementation (the model's and every sub-model's);
- each module's attributes (training flag, timm's ``fused_attn``, flags transformers sets when it installs hooks
  of its own) and tables (forward/backward hooks, and torch's global ones; parameters, buffers, children);
- each parameter's ``requires_grad`` and ``.grad``.

Weights are never written, so the model's outputs after the call equal its outputs before, bit for bit
(``tests/test_notebook.py``). A family says how it takes such a model in with ``Family.adopt``
(``models/families/<name>/model.py``: ``adopt(model, processor) -> Adopted | None``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from models.core import capture
from models.core.loading import LoadedModel

# the tables a module keeps (an OrderedDict each: refilled in place, so the user's hook handles stay valid)
HOOK_TABLES = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
TABLES = HOOK_TABLES + ("_parameters", "_buffers", "_modules", "_state_dict_hooks", "_state_dict_pre_hooks",
                        "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
GLOBAL_HOOK_TABLES = ("_global_forward_hooks", "_global_forward_hooks_always_called", "_global_forward_pre_hooks",
                      "_global_backward_hooks", "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs")
DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class Adopted:
    """A user's model as a family runs it: the ``LoadedModel`` its ``run`` and analyses read (the user's own object
    inside), and what must be switched on the model while it is borrowed (``prepare(model)``, e.g. the capture
    attention function). ``owner`` is the object the user passed (``loaded.model`` may be a part of it, e.g. an
    encoder's base model), the one whose state is restored."""

    loaded: LoadedModel
    prepare: Callable[[nn.Module], None]
    owner: nn.Module


class Snapshot:
    """Everything a run may change on ``model``, taken before it is switched; ``restore`` puts it all back.

    Per module its attributes as they were (``__dict__``: the training flag, timm's ``fused_attn``, a flag such as
    transformers' ``_output_capturing_hooks_installed`` that must not outlive the hooks it stands for) and the
    contents of its tables (hooks, parameters, buffers, children); per parameter ``requires_grad`` and ``.grad``;
    per config the attention implementation; torch's global hooks."""

    def __init__(self, model: nn.Module):
        self.attributes = [(m, dict(m.__dict__)) for m in model.modules()]
        self.tables = [(table, dict(table)) for m, saved in self.attributes for name, table in saved.items()
                       if name in TABLES and isinstance(table, dict)]
        self.parameters = [(p, p.requires_grad, p.grad) for p in model.parameters()]
        self.configs = [(config, getattr(config, "_attn_implementation_internal", None)) for config in _configs(model)]
        from torch.nn.modules import module as torch_module

        self.tables += [(getattr(torch_module, name), dict(getattr(torch_module, name))) for name in GLOBAL_HOOK_TABLES
                        if isinstance(getattr(torch_module, name, None), dict)]

    def restore(self) -> None:
        for config, implementation in self.configs:
            if getattr(config, "_attn_implementation_internal", None) != implementation:
                config._attn_implementation_internal = implementation
        for table, saved in self.tables:
            _refill(table, saved)
        for module, saved in self.attributes:
            current = module.__dict__
            for name in [name for name in current if name not in saved]:
                del current[name]
            for name, value in saved.items():
                if current.get(name, _MISSING) is not value:
                    current[name] = value
        for parameter, requires_grad, grad in self.parameters:
            parameter.requires_grad_(requires_grad)
            parameter.grad = grad


_MISSING = object()


def _refill(table: dict, saved: dict) -> None:
    """``table`` holds exactly ``saved`` again, in its order, and is still the same object."""
    if list(table.items()) != list(saved.items()):
        table.clear()
        table.update(saved)


def _configs(model: nn.Module) -> list:
    """Every transformers config reachable from ``model``: its modules' and their sub-configs, each once."""
    found, seen = [], set()
    pending = [m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation")]
    while pending:
        config = pending.pop()
        if id(config) in seen:
            continue
        seen.add(id(config))
        found.append(config)
        for key in getattr(config, "sub_configs", {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None and hasattr(sub, "_attn_implementation"):
                pending.append(sub)
    return found


@contextlib.contextmanager
def borrowed(model: nn.Module, prepare: Callable[[nn.Module], None] = lambda model: None) -> Iterator[nn.Module]:
    """Inside the block ``model`` is in eval mode, keeps no gradients and has been switched by ``prepare``; on exit,
    however the block ends, it is exactly as it was found (``Snapshot``)."""
    snapshot = Snapshot(model)
    try:
        model.eval()
        model.requires_grad_(False)
        prepare(model)
        yield model
    finally:
        snapshot.restore()


def use_capture(model: nn.Module) -> str:
    """Switch a transformers model (and its sub-models) to the capture attention function, or, as the app's loader
    does (``loading.load_transformers``), to its own eager attention where four tokens show that its attention does
    not reach the interface (or that its SDPA path is not causal where it must be); refuse in words where neither
    draws a map. Returns how its maps are drawn, in words (``LoadedModel.capture``)."""
    capture.register()
    name = type(model).__name__
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        raise ValueError(f"{name} cannot switch its attention implementation (transformers 5 models can, with "
                         "set_attn_implementation), so its attention cannot be captured here.")
    try:
        setter(capture.ATTENTION_NAME)
    except (KeyError, ValueError):  # classes chosen by implementation name that know no other (Falcon)
        pass
    if getattr(model.config, "_attn_implementation", None) == capture.ATTENTION_NAME:
        found = capture.probe(model)
        if found is None or (found.recorded and not found.not_causal):
            return found.description() if found is not None else capture.CAPTURE_DESCRIPTION
    setter(capture.EAGER_PATH)
    found = capture.probe(model)
    if found is not None and not found.recorded:
        raise ValueError(f"{name}: no attention weights reach the explorer: its attention does not pass through "
                         "transformers' AttentionInterface and its own eager forward returned no maps.")
    return capture.EAGER_PATH_DESCRIPTION


def device_and_dtype(model: nn.Module) -> tuple[str, str]:
    """Where a model lives and in what precision, as the app names them ("cuda:0", "bfloat16"); a ValueError for a
    precision the explorer does not draw."""
    parameter = next(model.parameters(), None)
    if parameter is None:
        raise ValueError(f"{type(model).__name__} has no parameters: nothing to explore")
    device = getattr(model, "device", parameter.device)
    dtype = parameter.dtype
    if dtype not in DTYPES:
        raise ValueError(f"the model's weights are {dtype}; the explorer draws float32, float16 and bfloat16 models "
                         f"(model.to(torch.float32) on a copy).")
    return str(torch.device(device)), DTYPES[dtype]


def model_name(model: nn.Module) -> str:
    """What names a user's model in titles and file names: the last part of the id or folder it was loaded from,
    else its class."""
    config = getattr(model, "config", None)
    where = str(getattr(config, "name_or_path", "") or "").rstrip("/")
    return where.rsplit("/", 1)[-1] if where else type(model).__name__


def is_transformers(model) -> bool:
    return isinstance(model, nn.Module) and type(model).__module__.startswith("transformers.") \
        and hasattr(model, "config")


def tokenizer_of(processor, family_title: str):
    """The tokenizer in what the user passed (a tokenizer, or a processor holding one), or a ValueError in words."""
    tokenizer = getattr(processor, "tokenizer", processor)
    if tokenizer is None or not callable(getattr(tokenizer, "decode", None)):
        raise ValueError(f"a {family_title} needs its tokenizer: explore(model, tokenizer, text), with the tokenizer "
                         "the model was trained with (AutoTokenizer.from_pretrained(...)).")
    return tokenizer


def spec_of(family: str, model: nn.Module):
    """The ``ModelSpec`` a user's model object is labelled with (source "memory")."""
    from models.core.specs import ModelSpec

    name = model_name(model)
    return ModelSpec(family, name, "memory", name, "the model's own", "the model's own",
                     f"a {type(model).__name__} passed to explore() (app/notebook.py)")


def is_causal_lm(model) -> bool:
    """A transformers model with a language-modelling head that predicts the next token (``*ForCausalLM``,
    ``GPT2LMHeadModel``): what ``AutoModelForCausalLM`` builds."""
    if not is_transformers(model) or getattr(model.config, "is_encoder_decoder", False):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update(value if isinstance(value, (tuple, list)) else (value,))
    return type(model).__name__ in names
