"""The model card of the translation minis, written from ``metrics.json`` so its numbers are the measured ones."""
from __future__ import annotations

from pathlib import Path

TITLES = {
    "transformer": "Transformer (Marian architecture, trained from scratch)",
    "gru-attention": "GRU encoder–decoder with additive attention (Bahdanau et al. 2015)",
    "gru-fixed": "GRU encoder–decoder with a fixed context vector (Cho et al. 2014)",
}

SHORT_TITLES = {"transformer": "Transformer", "gru-attention": "GRU + additive attention",
                "gru-fixed": "GRU, fixed context"}


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def card_text(metrics: dict) -> str:
    data = metrics["data"]
    lines = [
        "# Translation minis: English → French on a generated grammar",
        "",
        "Trained by this project; **not** general translators. They know only the vocabulary and constructions of",
        "`models/minis/translation/grammar.py`: articles and gender, elision, *of the* → *du/des*, post-nominal",
        "adjectives in mirror order (*European Economic Area* → *zone économique européenne*), agreement of",
        "adjectives, verbs and passive participles, four tenses, counts and dates, nested prepositional phrases and",
        "coordination. Licence: the project's licence.",
        "",
        "## Data",
        f"- {data['train_sentences']:,} training pairs (seed {data['train_seed']}) and {data['test_sentences']:,} "
        f"held-out pairs (seed {data['test_seed']}, no English sentence shared with training); at most "
        f"{data['max_source_words']} source words, {data['mean_source_words']:.1f} on average.",
        f"- One word-level vocabulary of {data['vocabulary']} pieces shared by both languages; numbers are split into "
        "digits (SentencePiece-style `▁` marks a word start).",
        "",
        "## Command",
        "```",
        "python -m models.minis.translation.train            # all three; one CPU thread",
        "python -m models.minis.translation.train --models transformer",
        "```",
        "Steps: " + ", ".join(f"{name} {m['steps']}" for name, m in metrics.get("models", {}).items()) +
        " (batch 64, AdamW, learning rate 1e-3 with warm-up and cosine decay, label smoothing 0.1).",
        "",
        "## Measured on the held-out pairs",
        "Exact match: greedy output equals the reference token for token. Alignment error rate (AER, Och & Ney 2003)",
        "of attention against the grammar's gold word links, with the reference forced through the decoder; attention",
        "merged to words (sum over source pieces, mean over target pieces), `</s>` left out, each French word aligned",
        "to its most-attended English word. Lower AER is better; 0 is perfect.",
        "",
        "| model | parameters | weights | training | exact match | AER |",
        "|---|---|---|---|---|---|",
    ]
    for name, title in TITLES.items():
        m = metrics.get("models", {}).get(name)
        if m is None:
            continue
        align = m.get("alignment")
        if name == "transformer" and align:
            best = align["best_head"]
            aer = (f"best head (layer {best['layer']}, head {best['head']}): {best['aer']:.3f}; "
                   f"all layers and heads averaged: {align['all_layers_average']:.3f}")
        elif align:
            aer = f"{align['aer']:.3f}"
        else:
            aer = "— (no attention)"
        lines.append(f"| {title} | {m['parameters']:,} | {m['weights_bytes'] / 2**20:.1f} MB | {m['steps']} steps, "
                     f"{m['train_cpu_seconds'] / 60:.1f} CPU min | {_percent(m['exact_match'])} | {aer} |")
    transformer = metrics.get("models", {}).get("transformer")
    if transformer and transformer.get("alignment"):
        lines += ["", "Transformer AER per decoder layer (attention averaged over heads): " + ", ".join(
            f"layer {i}: {v:.3f}" for i, v in enumerate(transformer["alignment"]["per_layer"])) + "."]
        shifted = transformer["alignment"].get("shifted")
        if shifted:
            best = shifted["best_head"]
            lines += ["", "Reading each French word off the decoder step whose *input* it is (shift-att, Chen et al. "
                      f"2020) instead of the step that produced it: best head (layer {best['layer']}, head "
                      f"{best['head']}) {best['aer']:.3f}, all layers and heads averaged "
                      f"{shifted['all_layers_average']:.3f}. The app shows the step that produced each word."]
    lines += ["", "### Exact match by source length (words)", ""]
    names = [n for n in TITLES if n in metrics.get("models", {})]
    if names:
        buckets = [b["bucket"] for b in metrics["models"][names[0]]["by_length"]]
        lines.append("| model | " + " | ".join(buckets) + " |")
        lines.append("|---|" + "---|" * len(buckets))
        for name in names:
            cells = {b["bucket"]: f"{_percent(b['accuracy'])} (n={b['count']})" for b in
                     metrics["models"][name]["by_length"]}
            lines.append(f"| {SHORT_TITLES[name]} | " + " | ".join(cells.get(b, "—") for b in buckets) + " |")
    lines += ["", "Training time is CPU time of one thread (`torch.set_num_threads(1)`); each model stops at its step",
              "count or its CPU budget, whichever comes first. `metrics.json` also records the wall-clock time, which",
              "on the shared development machine was longer because other jobs ran beside it."]
    return "\n".join(lines) + "\n"


def write_card(folder: Path, metrics: dict) -> None:
    (folder / "card.md").write_text(card_text(metrics))


def length_rows(metrics: dict) -> list[dict]:
    """Exact match per source-length bucket and model (by its short title), for the accuracy-against-length chart."""
    rows = []
    for name, m in metrics.get("models", {}).items():
        for bucket in m.get("by_length", []):
            rows.append({"model": SHORT_TITLES.get(name, name), **bucket})
    return rows


def summary_rows(metrics: dict) -> list[dict[str, str]]:
    """One row per model, as the page's table shows it: what it is and how well it did, as text ("98.2%", "0.022";
    "—" where a model has no attention to align)."""
    rows = []
    for name, title in TITLES.items():
        m = metrics.get("models", {}).get(name)
        if m is None:
            continue
        align = m.get("alignment") or {}
        best = align.get("best_head", {}).get("aer", align.get("aer"))
        average = align.get("all_layers_average", align.get("aer"))
        rows.append({"model": SHORT_TITLES[name], "exact match": _percent(m["exact_match"]),
                     "AER (best head)": "—" if best is None else f"{best:.3f}",
                     "AER (all heads averaged)": "—" if average is None else f"{average:.3f}",
                     "parameters": f"{m['parameters']:,}",
                     "training (CPU min)": f"{m['train_cpu_seconds'] / 60:.1f}"})
    return rows
