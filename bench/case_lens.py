"""``lens`` and ``ablation`` cases, inside SmolLM2-135M (the offline model).

``lens``: n = 512 tokens, against the forward it reads.

Ours = ``models.analysis.lens.logit_lens`` over a window of positions (16, the page's default, and 64, the most it
reads at once): every layer's residual stream at those positions through the final norm and the 49,152-token
unembedding. Baseline = the prompt run itself (``families.run``: tokenise, forward with capture, keep the residual
stream, top-10), which the lens reuses instead of a second forward. Target (issue 18): lens ≤ 2× the forward.
"""
from __future__ import annotations

import time

from bench.worker import worker


def _median(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2]


def task_lens(job: dict) -> dict:
    from bench.case_page import long_text
    from models import families
    from models.analysis import lens
    from models.core.inputs import TextInput
    from viz.figures.lens import LensOptions

    loaded = families.load(families.default_spec("causal_lm"), job["device"])
    inputs = TextInput(long_text(job["n"], seed=0), job["n"])
    families.run(loaded, TextInput("warm up", 16))
    forward, result = [], None
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        result = families.run(loaded, inputs)
        forward.append(time.perf_counter() - start)
    out = {"tokens": len(result.tokens), "forward_s": _median(forward), "residual_mb": result.residual.nbytes / 2**20}
    for count in (16, 64):
        samples = []
        for _ in range(job["repeats"]):
            start = time.perf_counter()
            lens.logit_lens(loaded, result, LensOptions(positions=count))
            samples.append(time.perf_counter() - start)
        out[f"lens_{count}_s"] = _median(samples)
    return out


def case_lens(n: int, device: str, repeats: int, threads: int) -> dict:
    timing = worker({"task": "lens", "n": n, "device": device, "repeats": max(repeats, 3), "threads": threads})
    worst = timing["lens_64_s"]
    return {"case": "lens", "n": timing["tokens"], "ours_s": worst, "baseline_s": timing["forward_s"],
            "ratio": worst / timing["forward_s"], "extra_mb": timing["residual_mb"], "bytes": None, **timing,
            "device": device, "threads": threads, "ours": "logit lens over 64 positions (16: lens_16_s)",
            "baseline": "the prompt run it reads (forward with capture)", "target": "ratio <= 2",
            "ok": worst / timing["forward_s"] <= 2}


ABLATION_PROMPT = "The Eiffel Tower is in the city of Paris, and the Colosseum is in the city of"


def task_ablation(job: dict) -> dict:
    from models import families
    from models.analysis import ablation
    from models.core.inputs import TextInput
    from viz.figures.ablation import AblationOptions

    loaded = families.load(families.default_spec("causal_lm"), job["device"])
    result = families.run(loaded, TextInput(ABLATION_PROMPT, 64))
    forward, samples = [], []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        families.run(loaded, TextInput(ABLATION_PROMPT, 64))
        forward.append(time.perf_counter() - start)
        start = time.perf_counter()
        found = ablation.head_ablation(loaded, result, AblationOptions())
        samples.append(time.perf_counter() - start)
    return {"tokens": len(result.tokens), "heads": int(found.effect.size), "forward_s": _median(forward),
            "ablation_s": _median(samples), "target_token": found.target}


def case_ablation(device: str, repeats: int, threads: int) -> dict:
    """Every head of SmolLM2 (30 × 9) zero-ablated on a ~20-token prompt, against one forward of that prompt."""
    timing = worker({"task": "ablation", "device": device, "repeats": max(repeats, 1), "threads": threads})
    return {"case": "ablation", "n": timing["tokens"], "ours_s": timing["ablation_s"],
            "baseline_s": timing["forward_s"], "ratio": timing["ablation_s"] / timing["forward_s"], "extra_mb": None,
            "bytes": None, **timing, "device": device, "threads": threads,
            "ours": f"{timing['heads']} heads ablated one at a time (batched forwards)",
            "baseline": "one forward of the prompt", "target": "ours_s <= 30 on 2 CPU cores",
            "ok": timing["ablation_s"] <= 30}


PATCHING_PAIR = ("Everyone knows that the Eiffel Tower is in the city of",
                 "Everyone knows that the Colosseum is in the city of")


def task_patching(job: dict) -> dict:
    from models import families
    from models.analysis import patching
    from models.core.inputs import TextInput
    from viz.figures.patching import PatchingOptions

    loaded = families.load(families.default_spec("causal_lm"), job["device"])
    result = families.run(loaded, TextInput(PATCHING_PAIR[0], 64))
    samples = []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        found = patching.activation_patching(loaded, result, PatchingOptions(PATCHING_PAIR[1]))
        samples.append(time.perf_counter() - start)
    return {"tokens": len(result.tokens), "patches": int(found.residual.size + found.heads.size),
            "patching_s": _median(samples), "answers": [found.clean_answer, found.corrupted_answer]}


def case_patching(device: str, repeats: int, threads: int) -> dict:
    """Residual stream (31 points × 12 positions) and every head (270) patched from clean into corrupted."""
    timing = worker({"task": "patching", "device": device, "repeats": max(repeats, 1), "threads": threads})
    return {"case": "patching", "n": timing["tokens"], "ours_s": timing["patching_s"], "baseline_s": None,
            "ratio": None, "extra_mb": None, "bytes": None, **timing, "device": device, "threads": threads,
            "ours": f"{timing['patches']} patches (residual stream at every layer and position, every head)",
            "target": "ours_s <= 60 on 2 CPU cores", "ok": timing["patching_s"] <= 60}
