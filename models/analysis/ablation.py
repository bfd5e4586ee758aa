"""Head ablation: which heads matter for this prediction. Each head of each layer is switched off, one at a time, and
the change in the log-probability of a target token after the prompt's last position is measured.

A head is switched off where its output enters the attention's output projection (``o_proj``, GPT-2's ``c_proj``):
its slice of that input is set to zero (``zero``) or to its mean over the prompt's positions on the clean run
(``mean``), the other heads untouched. The ablations run batched — one copy of the prompt per (layer, head) in each
forward, each copy with its own head off — so SmolLM2's 270 heads on a 13-token prompt take a handful of forwards.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from models.core import hooks, sites, text
from models.core.results import RunResult, TextResult

MODES = ("zero", "mean")
BATCH_TOKENS = 4096  # prompt copies per forward × prompt length, at most
MAX_TOKENS = 256  # longer prompts: 270 ablations would take minutes on a laptop


@dataclass(frozen=True)
class Ablation:
    model: str
    input_name: str
    target: str  # the token whose log-probability is measured, as displayed
    target_id: int
    mode: str
    clean_logprob: float  # log p(target) with every head on
    effect: np.ndarray  # (layers, heads) float32: log p(target) with the head off − clean_logprob
    kv_heads: int  # key/value heads per layer (GQA: fewer than heads; query head h uses group h // (heads / kv))

    @property
    def num_layers(self) -> int:
        return self.effect.shape[0]

    @property
    def num_heads(self) -> int:
        return self.effect.shape[1]

    def kv_group(self, head: int) -> int:
        return head // (self.num_heads // self.kv_heads)


def output_projections(model) -> list:
    """Each layer's attention output projection, whose input is the heads' outputs side by side."""
    return sites.of(model).projections()


@contextmanager
def heads_off(projections: list, heads: int, switched: list, replacement: list | None = None):
    """While active, batch row ``b`` has head ``switched[b] = (layer, head)`` off (``(-1, -1)``: none): its slice of
    that layer's output-projection input is zero, or ``replacement[layer][head]`` (a ``(head_dim,)`` tensor)."""
    import torch

    installed = []
    for index, projection in enumerate(projections):
        rows = [b for b, (layer, _) in enumerate(switched) if layer == index]
        if not rows:
            continue

        def hook(module, args, rows=rows, index=index):
            (hidden, *rest) = args
            batch, length, width = hidden.shape
            split = hidden.reshape(batch, length, heads, width // heads).clone()
            for row in rows:
                head = switched[row][1]
                split[row, :, head] = 0 if replacement is None else replacement[index][head].to(split.dtype)
            return (split.reshape(batch, length, width), *rest)

        installed.append(hooks.before(projection, hook))
    with hooks.installed(installed), torch.inference_mode():
        yield


def head_ablation(loaded, result: RunResult, options) -> Ablation:
    """Δ log p(target) at the last position for every (layer, head) switched off, ``options.mode`` ("zero" or
    "mean"); ``options.target`` is one token as typed, or empty for the model's own top-1 next token."""
    import torch

    if options.mode not in MODES:
        raise ValueError(f"the ablation mode is one of {', '.join(MODES)}, not {options.mode!r}")
    if not isinstance(result, TextResult) or not result.next_token:
        raise ValueError("head ablation reads a language model's prompt run (it has no next-token prediction)")
    model, tokenizer = loaded.model, loaded.tokenizer
    ids = prompt_ids(result)
    if len(ids) > MAX_TOKENS:
        raise ValueError(f"head ablation runs on prompts of up to {MAX_TOKENS} tokens (this one has {len(ids)}): "
                         "every head means one more forward")
    target = text.single_token_id(tokenizer, options.target, result.next_token[0].token_id)
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    projections = output_projections(model)
    device = next(model.parameters()).device
    prompt = torch.tensor([ids], device=device)

    # only the last position through the LM head: full logits of a 4,096-token batch would be 0.8 GB for SmolLM2
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}

    def logprobs(switched, replacement=None) -> torch.Tensor:
        batch = prompt.expand(len(switched), -1)
        with heads_off(projections, heads, switched, replacement):
            logits = model(input_ids=batch, use_cache=False, **keep).logits[:, -1].float()
        return torch.log_softmax(logits, dim=-1)[:, target].cpu()

    replacement = _mean_head_outputs(model, projections, heads, prompt) if options.mode == "mean" else None
    clean = float(logprobs([(-1, -1)])[0])
    every = [(layer, head) for layer in range(len(projections)) for head in range(heads)]
    per_forward = max(1, BATCH_TOKENS // len(ids))
    values = torch.cat([logprobs(every[i:i + per_forward], replacement) for i in range(0, len(every), per_forward)])
    effect = (values.numpy() - clean).reshape(len(projections), heads).astype(np.float32)
    return Ablation(model=result.model.short_name, input_name=result.input_name,
                    target=text.display_token(tokenizer.decode([target])), target_id=target, mode=options.mode,
                    clean_logprob=clean, effect=effect, kv_heads=kv_heads)


def prompt_ids(result: RunResult) -> list[int]:
    """The prompt's token ids exactly as the run saw them."""
    ids = result.token_ids if isinstance(result, TextResult) else ()
    if not ids:
        raise ValueError("this run did not keep its token ids (head ablation reads a language model's prompt run)")
    return list(ids)


def _mean_head_outputs(model, projections: list, heads: int, prompt) -> list:
    """Per layer, ``(heads, head_dim)``: each head's output averaged over the prompt's positions, clean run."""
    import torch

    means = [None] * len(projections)

    def keep(index):
        def hook(module, args):
            hidden = args[0]
            means[index] = hidden[0].reshape(hidden.shape[1], heads, -1).mean(0)
        return hook

    with hooks.installed(hooks.before(projection, keep(index)) for index, projection in enumerate(projections)), \
            torch.inference_mode():
        model(input_ids=prompt, use_cache=False)
    return means
