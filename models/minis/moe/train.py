"""Train the mini mixture-of-experts language model: ``python -m models.minis.moe.train``.

A transformers ``MixtralConfig`` trained from scratch (so the page's capture code treats it like any hub MoE model):
8 experts per layer, top-2 routing with softmax renormalised over the two (Jiang et al. 2024, eq. 2), and the
Switch load-balancing loss ``α · E · Σ_i f_i P_i`` (Fedus et al. 2021, eq. 4) added to the next-token loss.
The text is the seeded prose / Python / numbers mix of ``data.py``; the tokenizer is a 1024-token byte-level BPE
trained on it. One CPU thread, a step budget that fits in ~15 minutes; the card reports what was measured.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from models.minis import cli
from models.minis.moe import data, metrics

OUTPUT = Path(__file__).resolve().parents[3] / "sample_data" / "moe"
EOS = "<|endoftext|>"


@dataclass
class MiniMoEConfig:
    vocab_size: int = 1024  # byte-level BPE: small enough that the embedding stays a minor share of the weights
    hidden_size: int = 128
    intermediate_size: int = 256  # per expert
    num_hidden_layers: int = 4  # several MoE layers, so cross-layer consistency means something
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # grouped-query attention, as in Mixtral
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    max_position_embeddings: int = 512  # the page routes at most 512 tokens
    router_aux_loss_coef: float = 0.01  # Switch's α; Mixtral's default 0.001 is too weak for a model this small
    seq_len: int = 512
    batch_size: int = 4  # 2048 tokens a step
    steps: int = 2400
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    train_chars: int = 8_000_000
    eval_chars: int = 200_000
    seed: int = 0
    max_minutes: float = 16.0  # hard stop: with data, tokenizer and evaluation the command stays under 20 minutes


def build_tokenizer(text: str, vocab_size: int):
    """Byte-level BPE (GPT-2 style, so any input is encodable) trained on ``text``; a transformers fast tokenizer."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator((text[i:i + 100_000] for i in range(0, len(text), 100_000)), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, unk_token=EOS,
                                   pad_token=EOS, model_max_length=512)


def encode(tokenizer, text: str, chunk_chars: int = 100_000) -> torch.Tensor:
    """The text as one int64 token stream, encoded in chunks cut at blank lines."""
    ids, start = [], 0
    while start < len(text):
        end = text.find("\n\n", start + chunk_chars)
        end = len(text) if end < 0 else end
        ids += tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
        start = end
    return torch.tensor(ids, dtype=torch.long)


def make_model(cfg: MiniMoEConfig):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, num_local_experts=cfg.num_local_experts,
        num_experts_per_tok=cfg.num_experts_per_tok, max_position_embeddings=cfg.max_position_embeddings,
        router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=False, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, router_jitter_noise=0.0,
    )
    return MixtralForCausalLM(config)


def balance_loss(router_logits: tuple[torch.Tensor, ...], top_k: int) -> torch.Tensor:
    """Switch load-balancing loss per layer, ``E · Σ_i f_i P_i`` (Fedus et al. 2021, eq. 4), averaged over layers.

    ``f_i``: share of the layer's top-k assignments that went to expert i; ``P_i``: its mean router probability.
    1 when balanced. Per layer on purpose: transformers' ``load_balancing_loss_func`` pools the counts of all layers,
    which lets one layer's overloaded expert hide behind another layer's idle one.
    """
    losses = []
    for logits in router_logits:  # (B·T, E)
        probs = torch.softmax(logits.float(), dim=-1)
        num_experts = probs.shape[-1]
        chosen = torch.nn.functional.one_hot(probs.topk(top_k, dim=-1).indices, num_experts).sum(dim=1)  # (B·T, E)
        share = chosen.float().mean(dim=0) / top_k
        losses.append(num_experts * (share * probs.mean(dim=0)).sum())
    return torch.stack(losses).mean()


def learning_rate(step: int, cfg: MiniMoEConfig, time_fraction: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to a tenth; on a busy machine the decay follows the time budget instead
    (``time_fraction`` = share of ``max_minutes`` used), so a run cut short by the clock still ends annealed."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    progress = max((step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps), time_fraction)
    return cfg.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train(cfg: MiniMoEConfig, output: Path = OUTPUT) -> dict:
    torch.set_num_threads(1)
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the tokenizer trainer: one core, like the rest
    torch.manual_seed(cfg.seed)
    started = time.time()
    train_text = data.corpus(cfg.train_chars, seed=cfg.seed)
    tokenizer = build_tokenizer(train_text, cfg.vocab_size)
    stream = encode(tokenizer, train_text)
    print(f"corpus: {len(train_text):,} characters -> {stream.numel():,} tokens "
          f"({time.time() - started:.0f} s)", flush=True)

    model = make_model(cfg)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.learning_rate,
                                  betas=(0.9, 0.95))
    rng = random.Random(cfg.seed)
    deadline = started + cfg.max_minutes * 60
    train_started = time.time()
    steps_done, history = 0, []
    for step in range(cfg.steps):
        if time.time() > deadline:
            print(f"time budget reached after {step} steps", flush=True)
            break
        starts = [rng.randrange(0, stream.numel() - cfg.seq_len - 1) for _ in range(cfg.batch_size)]
        batch = torch.stack([stream[s:s + cfg.seq_len] for s in starts])  # (B, T)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg, (time.time() - train_started) / (deadline - train_started))
        out = model(input_ids=batch, output_router_logits=True)
        lm_loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, cfg.vocab_size).float(),
                                                    batch[:, 1:].reshape(-1))
        balance = balance_loss(out.router_logits, cfg.num_experts_per_tok)
        (lm_loss + cfg.router_aux_loss_coef * balance).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps_done = step + 1
        if step % 100 == 0 or step == cfg.steps - 1:
            lm_value, balance_value = lm_loss.detach().item(), balance.detach().item()
            history.append({"step": step, "lm_loss": round(lm_value, 4), "balance_loss": round(balance_value, 4)})
            print(f"step {step:5d}  lm loss {lm_value:.3f}  balance loss {balance_value:.3f} (1 = even)  "
                  f"{time.time() - started:.0f} s", flush=True)
    train_seconds = time.time() - started

    model.eval()
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)
    measured = metrics.evaluate_folder(output, data.segments(cfg.eval_chars, seed=cfg.seed + 1))
    measured.update({"steps": steps_done, "train_seconds": round(train_seconds, 1),
                     "tokens_seen": steps_done * cfg.batch_size * cfg.seq_len, "history": history,
                     "config": asdict(cfg),
                     "parameters": sum(p.numel() for p in model.parameters())})
    (output / "metrics.json").write_text(json.dumps(measured, indent=1))
    (output / "card.md").write_text(metrics.card(measured))
    print(json.dumps({k: v for k, v in measured.items() if k not in ("history", "config", "per_layer")}, indent=1))
    return measured


def main(argv: list[str] | None = None) -> None:
    args = cli.parse(__doc__, argv, OUTPUT, MiniMoEConfig.steps, MiniMoEConfig.max_minutes, measure=False)
    train(MiniMoEConfig(steps=args.steps, max_minutes=args.minutes), args.out)


if __name__ == "__main__":
    main()
