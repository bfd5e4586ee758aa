"""``python -m app.cli --page corpus``: per-head statistics over a folder (or a bundled corpus) to JSON and Parquet.

    python -m app.cli --page corpus --input FOLDER --engine local --format json --out DIR [--model KEY]
        [--documents N] [--max-tokens 256]

``--input`` is a folder of .txt/.md/.jsonl/.zip files or a bundled corpus (python-docs, translation, moe-mix);
``--results DIR`` alone reopens a results folder and exports it without running anything.
Per-document results go to DIR/results-<model>-<corpus>/ (Parquet; a re-run resumes there); the summary to
DIR/corpus_<model>_<corpus>.json as {"documents", "tokens", "skipped", "heads": [{"layer", "head", <statistic>,
<statistic>_std, ...}]}; ``--format`` may add csv (the heads table) and png/svg (a layer × head map of --statistic).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from viz import export

OPTIONS = ("input", "engine", "documents", "statistic", "actors", "results")


def _spec(model: str | None):
    from models import families

    if not model:
        return families.default_spec("causal_lm")
    for family in ("causal_lm", "encoder", "moe"):
        for spec in families.specs(family):
            if spec.key == model:
                return spec
    return families.custom("causal_lm", model)


def corpus_from(name: str, count: int | None):
    from models.corpus import readers

    if name in readers.BUNDLED:
        corpus = readers.bundled(name, count)
    else:
        corpus = readers.read_folder(name)
    return corpus.head(count) if count else corpus


def render(args, given: dict[str, str]) -> list[Path]:
    from models import families
    from models.corpus import analysis, engine
    from viz.figures import corpus as figures

    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise ValueError(f"the corpus page has no option {', '.join('--' + u for u in unknown)}; it has: "
                         f"{', '.join('--' + o for o in OPTIONS)} (and --model, --max-tokens, --format, --out)")
    if "results" in given and "input" not in given:  # reopen: nothing runs
        from models.corpus.store import ResultStore

        return _write(args, analysis.summarize(ResultStore.open(given["results"])), given, [])
    if "input" not in given:
        raise ValueError("give --input: a folder of .txt/.jsonl/.zip files, or python-docs, translation, moe-mix")
    try:
        count = int(given["documents"]) if "documents" in given else None
        actors = int(given.get("actors", 2))
    except ValueError:
        raise ValueError("--documents and --actors take whole numbers") from None
    corpus = corpus_from(given["input"], count)
    spec = _spec(args.model)
    loaded = families.load(spec, args.device, args.dtype)
    max_tokens = args.max_tokens or 256
    out = Path(args.out)
    name = figures._slug(spec.short_name, corpus.name)
    folder = out / f"results-{name}" if args.dtype == "float32" else out / f"results-{name}-{args.dtype}"

    def progress(p) -> None:
        eta = f", ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""
        print(f"\r{p.done}/{p.total} documents, {p.tokens_per_s:.0f} tokens/s{eta}", end="", file=sys.stderr)

    store = engine.run_corpus(corpus, loaded, folder, given.get("engine", "local"), max_tokens, progress,
                              actors=actors)
    print(file=sys.stderr)
    return _write(args, analysis.summarize(store), given, [folder])


def _write(args, summary, given: dict[str, str], written: list[Path]) -> list[Path]:
    from viz.figures import corpus as figures

    figure = figures.statistic_map(summary, given.get("statistic", "entropy_bits"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = figures._slug(summary.info.model.rstrip("/").rsplit("/", 1)[-1], summary.info.corpus)
    if "json" in args.formats:
        path = out / f"corpus_{name}.json"
        path.write_text(json.dumps(figures.heads_payload(summary), indent=1, allow_nan=False))
        written.append(path)
    others = [f for f in args.formats if f != "json"]
    if others:
        written += export.write(figure, others, out)
    return written
