"""Explanations and their faithfulness (issue 17): speed targets and the benchmark over generated shapes.

    python -m bench.case_attribution speed                 # the speed targets, JSON lines
    python -m bench.case_attribution shapes --images 500   # AUCs and the pointing game over held-out shapes
    python -m bench.case_attribution prompts --items 200   # AUCs over prompts from pydoc_data.topics (SmolLM2)
    python -m bench.case_attribution sentences --items 200 # AUCs over held-out grammar sentences (mini translator)
    python -m bench.case_attribution summary FILE.jsonl    # the table of a (partial) prompts / sentences run

Speed (one thread by default, paired and alternating, median of ``--repeats``):
- ``gradient_rollout``: ViT-B/16 at 224 with random weights (timm ``vit_base_patch16_224``; speed needs no weights):
  embeddings → eager forward with the attention kept differentiable → one backward to every layer's attention →
  Chefer's rollout, against timm's own fused inference forward. Target ≤ 3×.
- ``value_norms``: the same model, one hooked forward without gradients and the [CLS] row of ‖Σ_h α f‖, against the
  same forward. Target ≤ 1.3×.
- ``faithfulness_table``: the mini ViT shapes on one generated image: all 8 methods (IG with 32 steps) and their
  deletion and insertion curves (20 steps) plus 5 random orders, batched. Target ≤ 15 s.
- ``faithfulness_table_gpt`` (``speed --gpt``): the same table for a 19-token prompt on SmolLM2-135M (the packaged
  model), measured once, with the plain 19-token forward beside it for scale. Target ≤ 30 s.

Shapes (``--images`` held-out generated images, seed 31337 — the model trained on seed 0 and was tested on seed
987654), the true class as target, a removed patch greyed (the data config's mean): per method the deletion and
insertion AUC of the target's probability (0..1), Chefer et al. 2021a's positive and negative perturbation AUC
(top-1 accuracy against the fraction removed, most / least relevant first, in %, fractions 0..1 in 20 steps; theirs
are 0..0.9 in 10 steps on ImageNet), the pointing game and IoU against the generator's masks; random = one random
order / map per image.

Prompts (``prompts``): SmolLM2-135M (the packaged model) on ``--items`` prompts made offline from Python's
documentation (``python_doc_prompts``: the first 12 words of prose sentences of ``pydoc_data.topics``, seeded order),
the model's own next token as target, a removed token = the mean input embedding. Sentences (``sentences``): the mini
Transformer en→fr on the card's held-out test stream (grammar seed 2, no sentence of the 60k training pairs), the
middle output token as target, teacher-forced. Both write one JSON line per item (``--out``) with every method's
deletion / insertion AUC and each random order's; ``summary FILE...`` gives mean, sd and standard error per method.
The settings are flags (``--steps``, ``--seeds``, ``--ig-steps``); RESULTS.md states the ones used.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGETS = {"gradient_rollout": 3.0, "value_norms": 1.3, "faithfulness_table": 15.0}


def vit_base():
    """A randomly initialised ViT-B/16 at 224 as the app loads a ViT: fused attention off, eval, no gradients."""
    import timm
    import torch

    from models.core import capture_timm, images, loading
    from models.core.specs import ModelSpec
    from models.families.vit.model import LoadedVision

    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False)
    fused = timm.create_model("vit_base_patch16_224", pretrained=False)
    fused.load_state_dict(model.state_dict())
    capture_timm.disable_fused_attention(model)
    model = loading.finish(model, "cpu", "float32")
    fused = loading.finish(fused, "cpu", "float32")
    spec = ModelSpec("vit", "vit_base_patch16_224 (random)", "hub", "vit_base_patch16_224", "Apache-2.0", "nothing",
                     "random weights", library="timm")
    loaded = LoadedVision(spec, model, None, "cpu", "float32", data_config=images.data_config(model),
                          label_names=tuple(f"class {i}" for i in range(1000)))
    return loaded, fused


def paired(ours, baseline, repeats: int) -> tuple[float, float]:
    """Median seconds of ``ours()`` and ``baseline()``, run alternately after one warm-up each."""
    ours(), baseline()
    mine, theirs = [], []
    for _ in range(repeats):
        for call, into in ((ours, mine), (baseline, theirs)):
            started = time.perf_counter()
            call()
            into.append(time.perf_counter() - started)
    return statistics.median(mine), statistics.median(theirs)


def speed(repeats: int) -> list[dict]:
    import torch

    from models.analysis import attribution, faithfulness
    from models.families.vit import explain as vit_explain
    from models.minis.vit_shapes import data

    rows = []
    loaded, fused = vit_base()
    crop = (np.random.default_rng(0).random((224, 224, 3)) * 255).astype(np.uint8)
    ex = vit_explain.explainable(loaded, crop, 0)
    pixels = vit_explain.crop_tensor(loaded, crop)

    def forward():
        with torch.inference_mode():
            fused(pixels)

    def from_pixels(methods):
        def run():
            fresh = vit_explain.explainable(loaded, crop, 0)  # embedding the image is part of the work
            attribution.explain(fresh, methods)
        return run

    for name in ("gradient_rollout", "value_norms"):
        ours, baseline = paired(from_pixels((name,)), forward, repeats)
        rows.append({"case": name, "model": "vit_base_patch16_224 (random weights), 224 px", "ours_s": ours,
                     "baseline_s": baseline, "baseline": "timm fused inference forward", "ratio": ours / baseline,
                     "target": f"<= {TARGETS[name]}x", "ok": ours / baseline <= TARGETS[name]})
    del ex
    from models import families
    mini = families.load(next(s for s in families.specs("vit") if s.source == "mini" and s.id == "vit_shapes"))
    sample = data.make_sample(np.random.default_rng(31337))
    times = []
    for _ in range(max(1, repeats // 2)):
        started = time.perf_counter()
        table = faithfulness.faithfulness(vit_explain.explainable(mini, sample.image, sample.label), "mini",
                                          "shape", steps=20, seeds=5, ig_steps=32)
        times.append(time.perf_counter() - started)
    rows.append({"case": "faithfulness_table", "model": "mini ViT shapes, one generated image",
                 "ours_s": statistics.median(times), "methods": len(table.curves), "curves": 2, "steps": 20,
                 "random_seeds": 5, "forwards": (len(table.curves) + 5) * 2 * 21,
                 "target": f"<= {TARGETS['faithfulness_table']} s",
                 "ok": statistics.median(times) <= TARGETS["faithfulness_table"]})
    return rows


PROMPT = "The Eiffel Tower is in the city of Paris, which is the capital of the country called"


def speed_gpt() -> dict:
    import torch

    from models import families
    from models.analysis import explanations as explainable
    from models.analysis import faithfulness
    from models.core.inputs import TextInput

    loaded = families.load(families.default_spec("causal_lm"))
    result = families.run(loaded, TextInput(PROMPT, 64))
    ids = torch.tensor([list(result.token_ids)])
    forwards = []
    for _ in range(3):
        started = time.perf_counter()
        with torch.inference_mode():
            loaded.model(input_ids=ids, use_cache=False, logits_to_keep=1)
        forwards.append(time.perf_counter() - started)
    started = time.perf_counter()
    table = faithfulness.faithfulness(explainable.explainable(loaded, result, None), loaded.spec.key, "prompt",
                                      steps=20, seeds=5, ig_steps=32)
    seconds = time.perf_counter() - started
    return {"case": "faithfulness_table_gpt", "model": loaded.spec.key, "tokens": len(ids[0]), "ours_s": seconds,
            "forward_s": statistics.median(forwards), "target": "<= 30 s", "ok": seconds <= 30,
            "aucs": {m: [c.deletion_auc, c.insertion_auc] for m, c in table.curves.items()},
            "random": [table.random_auc("deletion"), table.random_auc("insertion")]}


def shapes(images: int, ig_steps: int, seed: int, progress_every: int = 25) -> dict:
    import torch

    from models import families
    from models.analysis import attribution, faithfulness
    from models.analysis.methods import SHARED
    from models.families.vit import explain as vit_explain
    from models.minis.vit_shapes import data

    loaded = families.load(next(s for s in families.specs("vit") if s.source == "mini" and s.id == "vit_shapes"))
    methods = SHARED
    names = [*methods, "random"]
    steps = 20
    rng, noise = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    grid = tuple(int(g) for g in loaded.model.patch_embed.grid_size)
    collected = {name: {k: [] for k in ("deletion_auc", "insertion_auc", "positive_auc", "negative_auc",
                                        "pointing", "iou")} for name in names}
    correct = 0
    started = time.perf_counter()
    for index in range(images):
        sample = data.make_sample(rng)
        ex = vit_explain.explainable(loaded, sample.image, sample.label)
        found = attribution.explain(ex, methods, ig_steps)
        with torch.no_grad():
            correct += int(ex.logits(ex.embeddings)[0].argmax()) == sample.label
        coverage = vit_explain.patch_coverage(sample.mask, grid).ravel()
        scores = {**found.scores, "random": noise.random(coverage.size)}
        masks = []
        for name in names:
            order = faithfulness.ranking(scores[name])
            deletion, insertion = faithfulness.perturbation_masks(order, steps)
            negative, _ = faithfulness.perturbation_masks(order[::-1].copy(), steps)
            masks.append(torch.cat([deletion, insertion, negative]))
        probabilities, top1 = faithfulness.target_outcomes(ex, torch.cat(masks))
        probabilities = probabilities.reshape(len(names), 3, steps + 1)
        top1 = top1.reshape(len(names), 3, steps + 1).astype(np.float64)
        for row, name in enumerate(names):
            into = collected[name]
            into["deletion_auc"].append(faithfulness.auc(probabilities[row, 0]))
            into["insertion_auc"].append(faithfulness.auc(probabilities[row, 1]))
            into["positive_auc"].append(100 * faithfulness.auc(top1[row, 0]))
            into["negative_auc"].append(100 * faithfulness.auc(top1[row, 2]))
            hit, iou = vit_explain.pointing_and_iou(np.asarray(scores[name]), coverage)
            into["pointing"].append(float(hit))
            into["iou"].append(iou)
        if (index + 1) % progress_every == 0:
            print(f"  {index + 1}/{images} images, {time.perf_counter() - started:.0f} s", file=sys.stderr,
                  flush=True)

    def summary(values):
        array = np.asarray(values, dtype=np.float64)
        return {"mean": float(array.mean()), "sd": float(array.std()), "se": float(array.std() / np.sqrt(len(array)))}

    return {"case": "shapes", "images": images, "seed": seed, "ig_steps": ig_steps, "steps": steps,
            "accuracy": correct / images, "seconds": time.perf_counter() - started,
            "replacement": "grey (the data config's mean; 0 after normalisation)",
            "methods": {name: {k: summary(v) for k, v in collected[name].items()} for name in names}}


def python_doc_prompts(count: int, words: int = 12, seed: int = 0) -> list[str]:
    """``count`` prompts, offline: the first ``words`` words of prose sentences (10–40 words, no code characters) of
    Python's documentation topics (``pydoc_data.topics``, the corpus page's "python-docs"), drawn in a seeded order."""
    import re
    from pydoc_data.topics import topics

    sentences = []
    for topic in sorted(topics):
        for paragraph in topics[topic].split("\n\n"):
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join(paragraph.split())):
                split = sentence.split()
                if 10 <= len(split) <= 40 and sentence[0].isupper() and not any(c in sentence for c in
                                                                                 "=*()[]{}<>_`|\\#:>"):
                    sentences.append(" ".join(split[:words]))
    unique = list(dict.fromkeys(sentences))
    order = np.random.default_rng(seed).permutation(len(unique))
    if count > len(unique):
        raise ValueError(f"only {len(unique)} prompts can be made, not {count}")
    return [unique[i] for i in order[:count]]


def text_case(explainables, out: Path, steps: int, seeds: int, ig_steps: int) -> None:
    """For each ``(name, Explainable)``: every method's deletion and insertion AUC and ``seeds`` random orders',
    one JSON line per item appended to ``out`` (so a run cut short still has its items)."""
    from models.analysis import attribution, faithfulness
    from models.analysis.methods import SHARED

    started = time.perf_counter()
    with out.open("a") as sink:
        for index, (name, ex) in enumerate(explainables):
            methods = tuple(m for m in SHARED if m in ex.methods)
            found = attribution.explain(ex, methods, ig_steps)
            curves, random = faithfulness.measure(ex, found, steps, seeds)
            row = {"item": name, "units": len(ex.units), "target": ex.target_name,
                   "probability": found.probability, "ig_delta": found.ig_delta,
                   "ig_difference": found.ig_difference,
                   "methods": {m: [c.deletion_auc, c.insertion_auc] for m, c in curves.items()},
                   "random": [[c.deletion_auc, c.insertion_auc] for c in random],
                   "elapsed_s": time.perf_counter() - started}
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(f"  {index + 1} items, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


def prompts(count: int, out: Path, steps: int, seeds: int, ig_steps: int, start: int = 0) -> None:
    from models import families
    from models.analysis import explanations as explainable
    from models.core.inputs import TextInput

    loaded = families.load(families.default_spec("causal_lm"))

    def items():
        for prompt in python_doc_prompts(count)[start:]:
            result = families.run(loaded, TextInput(prompt, 64))
            yield prompt, explainable.explainable(loaded, result, None)
    text_case(items(), out, steps, seeds, ig_steps)


def sentences(count: int, out: Path, steps: int, seeds: int, ig_steps: int, start: int = 0) -> None:
    """The mini Transformer en→fr on held-out grammar sentences (the card's test stream: seed 2, no English sentence
    of the 60k training pairs), greedy; the target is the middle output token (not </s>), teacher-forced."""
    from models import families
    from models.analysis import explanations as explainable
    from models.core.inputs import TextInput
    from models.families.translation import explain as translation_explain
    from models.minis.translation import grammar

    loaded = families.load(next(s for s in families.specs("translation") if s.id == "translation/transformer"))
    _, test = grammar.held_out_split(1, 2, 60_000, count, 40)

    def items():
        for pair in test[start:]:
            result = families.run(loaded, TextInput(pair.english, 128))
            choices = translation_explain.output_choices(result)
            yield pair.english, explainable.explainable(loaded, result, choices[len(choices) // 2][0])
    text_case(items(), out, steps, seeds, ig_steps)


def summary(*paths: Path) -> dict:
    """Mean, sd and standard error of each method's AUCs over the items of a ``prompts`` / ``sentences`` run; random:
    the mean of each item's random orders."""
    found = [json.loads(line) for one in paths for line in one.read_text().splitlines() if line.strip()]
    rows = list({row["item"]: row for row in found}.values())  # an item run by two processes counts once
    if not rows:
        raise ValueError(f"{', '.join(map(str, paths))} has no items yet")
    collected: dict[str, list] = {}
    for row in rows:
        for method, aucs in row["methods"].items():
            collected.setdefault(method, []).append(aucs)
        collected.setdefault("random", []).append(np.mean(row["random"], 0).tolist())
    table = {}
    for method, values in collected.items():
        array = np.asarray(values, dtype=np.float64)
        table[method] = {curve: {"mean": float(array[:, i].mean()), "sd": float(array[:, i].std()),
                                 "se": float(array[:, i].std() / np.sqrt(len(array)))}
                         for i, curve in enumerate(("deletion_auc", "insertion_auc"))}
    return {"items": len(rows), "seconds": max(r["elapsed_s"] for r in found), "methods": table,
            "beats_random_deletion": {m: float(np.mean([r["methods"][m][0] < np.mean(r["random"], 0)[0]
                                                         for r in rows if m in r["methods"]]))
                                      for m in collected if m != "random"}}


def summary_markdown(result: dict) -> str:
    lines = ["| method | deletion AUC (p) ↓ mean ± se (sd) | insertion AUC (p) ↑ mean ± se (sd) | "
             "items where deletion beats random |", "|---|---|---|---|"]
    for name, values in result["methods"].items():
        cells = [f"{values[k]['mean']:.3f} ± {values[k]['se']:.3f} ({values[k]['sd']:.3f})"
                 for k in ("deletion_auc", "insertion_auc")]
        share = result["beats_random_deletion"].get(name)
        cells.append("—" if share is None else f"{100 * share:.0f} %")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    lines = ["| method | deletion AUC (p) ↓ | insertion AUC (p) ↑ | positive pert. AUC (top-1, %) ↓ | "
             "negative pert. AUC (top-1, %) ↑ | pointing game ↑ | IoU ↑ |", "|---|---|---|---|---|---|---|"]
    for name, values in result["methods"].items():
        cells = [f"{values[k]['mean']:.3f} ± {values[k]['se']:.3f}" for k in ("deletion_auc", "insertion_auc")]
        cells += [f"{values[k]['mean']:.1f} ± {values[k]['se']:.1f}" for k in ("positive_auc", "negative_auc")]
        cells += [f"{values[k]['mean']:.3f} ± {values[k]['se']:.3f}" for k in ("pointing", "iou")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.case_attribution", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("speed", "shapes", "prompts", "sentences", "summary"))
    parser.add_argument("file", nargs="*", type=Path, help="summary: the JSON lines of prompts / sentences runs")
    parser.add_argument("--start", type=int, default=0, help="prompts / sentences: skip the first items (to split a "
                                                              "run over two processes)")
    parser.add_argument("--items", type=int, default=200, help="prompts / sentences: how many")
    parser.add_argument("--steps", type=int, default=20, help="prompts / sentences: curve steps")
    parser.add_argument("--seeds", type=int, default=5, help="prompts / sentences: random orders per item")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--ig-steps", type=int, default=32)
    parser.add_argument("--seed", type=int, default=31337)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gpt", action="store_true", help="speed: the SmolLM2 table instead of the ViT cases")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.what == "speed" and args.gpt:
        result = [speed_gpt()]
        print(json.dumps(result[0]))
    elif args.what in ("prompts", "sentences"):
        out = args.out or Path(f"/tmp/attribution_{args.what}.jsonl")
        (prompts if args.what == "prompts" else sentences)(args.items, out, args.steps, args.seeds, args.ig_steps,
                                                            args.start)
        result = summary(out)
        print(json.dumps(result))
        print(summary_markdown(result))
        return 0
    elif args.what == "summary":
        result = summary(*args.file)
        print(json.dumps(result))
        print(summary_markdown(result))
        return 0
    elif args.what == "speed":
        result = speed(args.repeats)
        for row in result:
            print(json.dumps(row))
    else:
        result = shapes(args.images, args.ig_steps, args.seed)
        print(json.dumps(result))
        print(markdown(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
