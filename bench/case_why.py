"""``why``: the score decomposition (issue 37) on SmolLM2-135M, 1,024 tokens.

Ours = ``models.analysis.why.why_cell`` (one cell's full decomposition: every pair, the marginals, the runner-up,
RoPE's bands, the intervention check) at the last layer and a middle one, and ``why_head`` (the composition table of
one head over its 32 strongest cells of the last 64 rows), on the page's run (``families.run``), after it. Baseline =
that run itself. The head roles that name the heads are measured once per model (a forward of 2 × 65 tokens) and
kept beside it: reported apart (``roles_s``), as the first cell of a session pays them.

Targets (issue 37): a cell ≤ 1 s after the run, a head's table ≤ 10 s, memory above the run ≤ 200 MB (peak RSS of
the call in a process of its own, the run held).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from bench.worker import worker

TOKENS = 1024
CELL_LAYERS = (29, 15)
HEAD = (18, 6)  # SmolLM2's strongest induction head


def _median(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2]


@dataclass(frozen=True)
class _Cell:
    layer: int
    head: int = 3
    query: int | None = None
    key: int | None = None
    check: bool = True


@dataclass(frozen=True)
class _Head:
    layer: int = HEAD[0]
    head: int = HEAD[1]
    first: int | None = None
    rows: int = 64
    cells: int = 32
    skip_first: bool = True


def task_why(job: dict) -> dict:
    from bench.case_page import long_text
    from bench.measure import measure_memory
    from models import families
    from models.analysis import why
    from models.core.inputs import TextInput

    loaded = families.load(families.default_spec("causal_lm"), job["device"])
    inputs = TextInput(long_text(TOKENS, seed=0), TOKENS)
    families.run(loaded, TextInput("warm up", 16))
    start = time.perf_counter()
    result = families.run(loaded, inputs)
    out = {"tokens": len(result.tokens), "run_s": time.perf_counter() - start}
    if job.get("memory"):  # one measurement per process: the first call's peak above the run
        start = time.perf_counter()
        why._named(loaded, result)
        out["roles_s"] = time.perf_counter() - start
        what = job["memory"]
        call = (lambda: why.why_cell(loaded, result, _Cell(CELL_LAYERS[0]))) if what == "cell" else \
            (lambda: why.why_head(loaded, result, _Head()))
        memory, found = measure_memory(call, job["device"])
        out.update({f"{what}_{name}": value for name, value in memory.items()}, source=found.source)
        return out
    start = time.perf_counter()
    why._named(loaded, result)
    out["roles_s"] = time.perf_counter() - start
    for layer in CELL_LAYERS:
        samples, found = [], None
        for _ in range(job["repeats"]):
            start = time.perf_counter()
            found = why.why_cell(loaded, result, _Cell(layer))
            samples.append(time.perf_counter() - start)
        out[f"cell_{layer}_s"] = _median(samples)
        out[f"cell_{layer}_pairs"] = int(found.contributions.size)
        out[f"cell_{layer}_error"] = found.error
        out["source"] = found.source
    samples = []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        table = why.why_head(loaded, result, _Head())
        samples.append(time.perf_counter() - start)
    out["head_s"] = _median(samples)
    out["head_cells"] = len(table.cells)
    # the same cell read with a forward stopped at the layer (what a run without its residual stream pays)
    start = time.perf_counter()
    positions = sorted({found.query, found.key, found.runner_up.position})
    capture = why._capture(loaded, result, CELL_LAYERS[0], positions, forward=True)
    why.cell(loaded.model, capture, CELL_LAYERS[0], 3, found.query, found.key, why._labels(result),
             why._named(loaded, result))
    out["cell_forward_s"] = time.perf_counter() - start
    return out


def case_why(device: str, repeats: int, threads: int, memory_repeats: int) -> dict:
    timing = worker({"task": "why", "device": device, "repeats": max(repeats, 3), "threads": threads})
    cell_memory = [worker({"task": "why", "device": device, "threads": threads, "memory": "cell"})
                   for _ in range(memory_repeats)]
    head_memory = [worker({"task": "why", "device": device, "threads": threads, "memory": "head"})
                   for _ in range(memory_repeats)]
    peaks = {"cell": _median([m["cell_peak_mb"] for m in cell_memory]),
             "head": _median([m["head_peak_mb"] for m in head_memory])}
    worst_cell = max(timing[f"cell_{layer}_s"] for layer in CELL_LAYERS)
    ok = worst_cell <= 1.0 and timing["head_s"] <= 10.0 and max(peaks.values()) <= 200
    return {"case": "why", "n": timing["tokens"], "ours_s": worst_cell, "baseline_s": timing["run_s"],
            "ratio": worst_cell / timing["run_s"], "extra_mb": max(peaks.values()), "bytes": None, **timing,
            "cell_peak_mb": peaks["cell"], "head_peak_mb": peaks["head"],
            "cell_peaks_mb": [m["cell_peak_mb"] for m in cell_memory],
            "head_peaks_mb": [m["head_peak_mb"] for m in head_memory], "device": device, "threads": threads,
            "ours": f"one cell's decomposition at layers {CELL_LAYERS} (worst), head {HEAD} table (head_s)",
            "baseline": "the page's prompt run it reads", "target": "cell <= 1 s, table <= 10 s, <= 200 MB",
            "ok": ok}
