"""``python -m app.cli --page corpus``: a corpus run (or a results folder reopened) drawn as any corpus view.

    python -m app.cli --page corpus --input FOLDER [--engine local|ray] [--documents N] [--actors A] \
        [--model KEY] [--max-tokens 256] [--view NAME ...view options] --format json,png --out DIR
    python -m app.cli --page corpus --results DIR [--view NAME ...view options] --format json,csv --out DIR

``--input`` is a folder of .txt/.md/.jsonl/.zip files or a bundled corpus (python-docs, translation, moe-mix); the
per-document results go to ``--results DIR`` when given, else DIR/results-<model>_<corpus>[-<dtype>]/ (Parquet; a
re-run resumes there). ``--results DIR`` alone reopens a folder without running the statistics again.
``--view`` is one of the corpus views (``--list``; default ``corpus_heads``, whose JSON is {"documents", "tokens",
"skipped", "heads": [{"layer", "head", <statistic>, <statistic>_std, ...}]}); the files are the view's figure, as the
page's download buttons make them. With ``--input``, the A→B search (``corpus_search --a X --b Y``) and the
query–key embedding (``corpus_embedding --layer L --head H``) are read in the statistics' own pass; reopened, they
run one pass over the folder's documents with the model the results are of.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from viz import export

RUN_OPTIONS = ("input", "engine", "documents", "actors")  # the run's own flags; the rest belong to the view
DEFAULT_VIEW = "corpus_heads"


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


def _view(args):
    from viz import figures

    names = [v.name for v in figures.page_views("corpus")]
    name = args.view or DEFAULT_VIEW
    if name not in names:
        raise ValueError(f"the corpus page has no view {name!r}; choose from {', '.join(names)}")
    return figures.get(name)


def render(args, given: dict[str, str], build_options) -> list[Path]:
    """The view's files (and the results folder of a run). ``build_options``: ``app.cli``'s, which turns flags
    into a view's options."""
    from models import families
    from models.corpus import analysis, engine, store

    view = _view(args)
    used: set[str] = set()
    options = build_options(view.options, {k: v for k, v in given.items() if k not in RUN_OPTIONS}, used)
    unknown = sorted(set(given) - set(RUN_OPTIONS) - used)
    if unknown:
        fields = [f.name for f in view.option_fields()]
        raise ValueError(f"the corpus page has no option {', '.join('--' + u for u in unknown)} for the {view.name} "
                         f"view; it has: {', '.join('--' + o for o in (*RUN_OPTIONS, *fields))} (and --model, "
                         "--max-tokens, --format, --out)")
    written: list[Path] = []
    if "input" not in given:
        if not options.results:
            raise ValueError("give --input (a folder of .txt/.jsonl/.zip files, or python-docs, translation, "
                             "moe-mix) to run, or --results DIR to reopen a results folder")
        info = analysis.open_results(options.results).info
        loaded = None
        if view.name in ("corpus_top", "corpus_embedding", "corpus_search"):  # they read the model's q, k, tokens
            loaded = families.load(_spec(args.model or info.model), args.device, info.dtype)
        return _write(args, view.build(view.analysis(loaded, None, options), options), written)
    try:
        count = int(given["documents"]) if "documents" in given else None
        actors = int(given.get("actors", 2))
    except ValueError:
        raise ValueError("--documents and --actors take whole numbers") from None
    corpus = corpus_from(given["input"], count)
    spec = _spec(args.model)
    loaded = families.load(spec, args.device, args.dtype)
    max_tokens = args.max_tokens or 256
    if options.results:
        folder = Path(options.results)
    else:
        name = store.results_name(spec.short_name, corpus.name)
        folder = Path(args.out) / (f"results-{name}" if args.dtype == "float32" else f"results-{name}-{args.dtype}")
    options = dataclasses.replace(options, results=str(folder))
    also, finish = _same_pass(view, options, loaded, corpus, max_tokens)

    def progress(p) -> None:
        eta = f", ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""
        print(f"\r{p.done}/{p.total} documents, {p.tokens_per_s:.0f} tokens/s{eta}", end="", file=sys.stderr)

    engine_name = given.get("engine", "local")
    engine.run_corpus(corpus, loaded, folder, engine_name, max_tokens, progress, actors=actors,
                      also=also if engine_name == "local" else ())
    print(file=sys.stderr)
    written.append(folder)
    if finish is not None and engine_name == "local" and finish.complete():
        data = finish.data()
    else:  # the statistics' views, or documents already done before this run: read the folder
        data = view.analysis(loaded, None, options)
    return _write(args, view.build(data, options), written)


class _SamePass:
    """A search or an embedding read in the corpus run's own forwards: ``complete`` when every document it needs
    was run in this pass (a resumed run skips those already written)."""

    def __init__(self, reduction, needed: set[str], data):
        self.reduction, self.needed, self.data = reduction, needed, data

    def complete(self) -> bool:
        return self.needed <= self.reduction.seen


def _same_pass(view, options, loaded, corpus, max_tokens: int):
    """(reductions for the run's pass, what turns them into the view's data) for the search and the embedding."""
    from models.corpus import analysis
    from models.corpus.forward import BatchRunner

    if view.name not in ("corpus_search", "corpus_embedding"):
        return (), None
    runner = BatchRunner(loaded, max_tokens)
    if view.name == "corpus_search":
        search = analysis.PatternShare(loaded.tokenizer, options.a, options.b, options.regex)
        search.choose(analysis._readable(runner, corpus.documents), options.searched)
        return [search], _SamePass(search, set(search.only), lambda: analysis.SearchResult(
            loaded.spec.key, options.a, options.b, search.ranked(), search.documents))
    tokenized, _ = runner.tokenized(corpus.documents[:options.embedded])
    sample = analysis.QueryKeySample(options.layer, options.head, {d.doc_id for d, _ in tokenized},
                                     analysis.EMBEDDING_TOKENS)
    return [sample], _SamePass(sample, set(sample.only), lambda: analysis.embed(
        sample, tokenized, loaded.tokenizer, options.method, loaded.spec.key))


def _write(args, figure, written: list[Path]) -> list[Path]:
    return written + export.write(figure, args.formats, Path(args.out))
