"""Train the three translation minis on the English→French grammar and measure them.

    python -m models.minis.translation.train                      # all three, ~28 CPU minutes on one thread
    python -m models.minis.translation.train --models gru-fixed   # just one (the others' metrics are kept)

Writes ``sample_data/translation/<model>/`` (config.json, model.safetensors, tokenizer files), ``metrics.json``
(every number the page shows) and ``card.md`` (data, command, measured quality). Each model trains for a fixed number
of optimiser steps or a budget of CPU time (one thread), whichever ends first; the learning rate follows the larger
of the two fractions done, so a slow machine still anneals to the end of its budget. CPU time rather than wall-clock
time, because on a shared machine the clock says more about the neighbours than about the training.

- transformer: a Marian (``MarianMTModel``) config trained from scratch, so it loads through
  ``AutoModelForSeq2SeqLM`` and the app's capture path exactly as ``Helsinki-NLP/opus-mt-en-fr`` does.
- gru-attention / gru-fixed: ``models.minis.translation.rnn.GRUTranslator`` with and without additive attention.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from models.minis import cli
from models.minis.translation import evaluate, grammar
from models.minis.translation import tokenizer as word_tokenizer
from models.minis.translation.card import write_card
from models.minis.translation.rnn import GRUConfig, GRUTranslator

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "sample_data" / "translation"
MODEL_NAMES = ("transformer", "gru-attention", "gru-fixed")


@dataclass
class DataConfig:
    train_sentences: int = 60_000  # fresh sentences; ~4 passes fit in the budget, so little is memorised
    test_sentences: int = 1_000  # held out: no English sentence of the test set occurs in training
    train_seed: int = 1
    test_seed: int = 2
    max_source_words: int = 40


# optimiser steps per model: the recurrent decoder needs more updates than the Transformer to learn agreement across
# long distances ("these companies ... were adopted" → "adoptées"); both GRUs get the same, so the comparison is fair
STEPS = {"transformer": 3_000, "gru-attention": 5_000, "gru-fixed": 5_000}


@dataclass
class TrainConfig:
    steps: int = 3_000
    minutes: float = 14.0  # cap in CPU minutes of this process (the issue allows 15 min per model on one CPU thread)
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 200
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    seed: int = 0


TRANSFORMER = dict(d_model=128, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=160,
                   dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True)
GRU = dict(embed_dim=128, hidden_dim=128, attention_dim=128, dropout=0.1)


def build_data(config: DataConfig):
    train, test = grammar.held_out_split(config.train_seed, config.test_seed, config.train_sentences,
                                         config.test_sentences, config.max_source_words)
    lexicon = grammar.lexicon_words()
    elided = [f"l'{w}" for w in lexicon if grammar.starts_with_vowel(w)]
    vocab = word_tokenizer.build_vocabulary([p.english for p in train] + [p.french for p in train],
                                            lexicon + elided)
    return train, test, word_tokenizer.make_tokenizer(vocab)


def encode(tok, pairs) -> list[tuple[list[int], list[int]]]:
    enc = tok([p.english for p in pairs], text_target=[p.french for p in pairs])
    return list(zip(enc["input_ids"], enc["labels"]))


def batches(examples, batch_size: int, rng: random.Random):
    """Endless batches of similar length (less padding): shuffle, sort within pools of 50 batches, shuffle batches."""
    while True:
        order = examples[:]
        rng.shuffle(order)
        pool = batch_size * 50
        chunks = []
        for start in range(0, len(order), pool):
            part = sorted(order[start:start + pool], key=lambda e: len(e[0]))
            chunks.extend(part[i:i + batch_size] for i in range(0, len(part), batch_size))
        rng.shuffle(chunks)
        yield from chunks


def collate(batch, pad_id: int = 0):
    src_len = max(len(s) for s, _ in batch)
    tgt_len = max(len(t) for _, t in batch)
    input_ids = torch.full((len(batch), src_len), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), tgt_len), -100, dtype=torch.long)
    for i, (s, t) in enumerate(batch):
        input_ids[i, :len(s)] = torch.tensor(s)
        labels[i, :len(t)] = torch.tensor(t)
    decoder_input = torch.cat([torch.full_like(labels[:, :1], pad_id), labels[:, :-1]], dim=1)
    decoder_input[decoder_input == -100] = pad_id
    return input_ids, (input_ids != pad_id).long(), decoder_input, labels


def make_model(name: str, vocab_size: int):
    if name == "transformer":
        import transformers

        config = transformers.MarianConfig(vocab_size=vocab_size, pad_token_id=0, eos_token_id=1,
                                           decoder_start_token_id=0, forced_eos_token_id=1, bos_token_id=None,
                                           share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
                                           **TRANSFORMER)
        model = transformers.MarianMTModel._from_config(config, attn_implementation="sdpa")
        model.generation_config = transformers.GenerationConfig(
            decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, forced_eos_token_id=1, num_beams=1,
            do_sample=False)
        return model
    return GRUTranslator(GRUConfig(vocab_size=vocab_size, attention=(name == "gru-attention"), **GRU))


def logits_of(model, name: str, input_ids, attention_mask, decoder_input):
    if name == "transformer":
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input).logits
    return model(input_ids, attention_mask, decoder_input)[0]


def train_one(name: str, train_examples, config: TrainConfig, vocab_size: int, log=print):
    torch.manual_seed(config.seed)
    model = make_model(name, vocab_size)
    model.train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    stream = batches(train_examples, config.batch_size, random.Random(config.seed))
    start, cpu_start, step, recent = time.time(), time.process_time(), 0, []
    while step < config.steps:
        elapsed = time.process_time() - cpu_start  # CPU time: a busy shared machine slows the clock, not the work
        done = max(step / config.steps, elapsed / (config.minutes * 60))
        if done >= 1.0:
            break
        warm = min(1.0, (step + 1) / config.warmup_steps)
        for group in optimiser.param_groups:
            group["lr"] = config.learning_rate * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * done)))
        input_ids, attention_mask, decoder_input, labels = collate(next(stream))
        logits = logits_of(model, name, input_ids, attention_mask, decoder_input)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                               label_smoothing=config.label_smoothing)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)
        optimiser.step()
        recent.append(loss.item())
        step += 1
        if step % 100 == 0:
            log(f"{name}: step {step}, loss {sum(recent) / len(recent):.3f}, {time.process_time() - cpu_start:.0f} CPU s, "
                f"{time.time() - start:.0f} s wall", flush=True)
            recent = []
    model.eval()
    return model, {"steps": step, "train_cpu_seconds": round(time.process_time() - cpu_start, 1),
                   "train_wall_seconds": round(time.time() - start, 1)}


def save(name: str, model, tok, folder: Path) -> int:
    """Write weights, config and tokenizer; returns the size of the weights in bytes."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(folder)
    if name == "transformer":
        model.save_pretrained(folder, safe_serialization=True)
    else:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2))
    return (folder / "model.safetensors").stat().st_size


def load_saved(name: str, folder: Path):
    """A model as ``save`` wrote it, ready to measure."""
    if name == "transformer":
        import transformers

        return transformers.MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()
    from safetensors.torch import load_file

    model = GRUTranslator(GRUConfig.from_dict(json.loads((folder / "config.json").read_text())))
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model.eval()


def measure(name: str, model, tok, test) -> dict:
    kind = "transformer" if name == "transformer" else "gru"
    if name == "transformer":  # eager attention returns the weights; the app reads them through its capture path
        model.set_attn_implementation("eager")
    result = evaluate.exact_match(kind, model, tok, test)
    if name == "transformer":
        result["alignment"] = evaluate.transformer_alignment(model, tok, test)
    elif name == "gru-attention":
        result["alignment"] = evaluate.gru_alignment(model, tok, test)
    return result


def main(argv: list[str] | None = None) -> None:
    def own(parser):
        parser.add_argument("--models", nargs="+", choices=MODEL_NAMES, default=list(MODEL_NAMES))
        parser.add_argument("--train-sentences", type=int, default=DataConfig.train_sentences)

    args = cli.parse(__doc__, argv, OUT, None, TrainConfig.minutes, extra=own)  # --steps: each model's own (STEPS)

    data_config = DataConfig(train_sentences=args.train_sentences)
    t0 = time.time()
    train, test, tok = build_data(data_config)
    print(f"{len(train)} training and {len(test)} held-out pairs, vocabulary {len(tok)}, {time.time() - t0:.0f} s")
    examples = [] if args.measure_only else encode(tok, train)

    metrics_path = args.out / "metrics.json"
    data_summary = {**asdict(data_config), "vocabulary": len(tok),
                    "mean_source_words": sum(len(p.en_words) for p in train) / len(train)}
    for name in args.models:
        train_config = TrainConfig(steps=args.steps or STEPS[name], minutes=args.minutes)
        if args.measure_only:
            model, run = load_saved(name, args.out / name), None
            size = (args.out / name / "model.safetensors").stat().st_size
        else:
            model, run = train_one(name, examples, train_config, len(tok))
            size = save(name, model, tok, args.out / name)
        t1 = time.time()
        quality = measure(name, model, tok, test)
        parameters = sum(p.numel() for p in model.parameters())
        # re-read just before writing: one process per model may run at the same time
        metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
        if metrics.get("data") != data_summary:  # other models were trained on different data: drop them
            metrics = {"data": data_summary, "models": {}}
        if run is None:  # measured again: keep how it was trained
            previous = metrics["models"].get(name, {})
            run = {k: previous[k] for k in ("steps", "train_cpu_seconds", "train_wall_seconds", "train")
                   if k in previous}
        metrics["models"][name] = {"train": asdict(train_config), **run, "parameters": parameters,
                                   "weights_bytes": size,
                                   "measure_seconds": round(time.time() - t1, 1),
                                   "architecture": TRANSFORMER if name == "transformer" else GRU, **quality}
        print(f"{name}: exact match {quality['exact_match']:.3f}", json.dumps(quality.get("alignment", {}))[:300])
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        metrics_path.write_text(json.dumps(metrics, indent=2, ensure_ascii=False))
        write_card(args.out, metrics)


if __name__ == "__main__":
    main()
