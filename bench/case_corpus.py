"""Corpus mode and long inputs on SmolLM2-135M (CPU): ``python -m bench.case_corpus [--parts ...]``.

- ``throughput``: the first ``--documents`` paragraphs of the bundled Python documentation (≤ 256 tokens each).
  Ours = ``engine.run_corpus(engine="local")`` (batched base-model forward, no LM head, statistics reduced in the
  capture function, Parquet writes included) on the model loaded in bfloat16 when the CPU multiplies it natively
  (AVX512-BF16/AMX; ``--dtype bfloat16`` on the CLI) and in float32. Baseline = a loop that runs the model with
  ``attn_implementation="eager"`` and ``output_attentions=True`` one document at a time and computes the same
  statistics from the returned maps with numpy (``statistics.eager_statistics``), in float32 (the default a user
  loads) and bfloat16. Paired and alternating, ``--rounds`` rounds, best of each. Target: ours ≥ 3× the float32
  baseline's tokens/s. Ceiling: the same batched forwards with nothing recorded (``forward_only``), the most any
  engine that runs the model could gain. Also: how far each dtype's statistics are from the float32 eager maps'.
  Memory: RSS after every persisted batch of a longer local run (flat = the last within a few MB of the second).
- ``ray``: the same documents on Ray Data with 2 actors × 1 thread, vs in process with 2 threads (the same 2
  cores). ``ray.init`` and the actors' start (each loads the model) are reported apart from the steady state.
  Target: Ray ≤ 1.3× the in-process time.
- ``long``: the GPT page's run (``causal_lm.run``) at n = 8,192 vs the SDPA forward of the same model
  (``logits_to_keep=1``), each in a fresh process; time, peak RSS above the loaded model, and the bytes of q/k as
  stored. Targets: time ≤ 1.3× SDPA, extra memory ≤ 1.1 × q/k bytes.
Prints one JSON line per part.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MB = 2**20


def _documents(count: int):
    from models.corpus import readers

    return readers.bundled("python-docs").head(count)


def bf16_is_fast() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX: oneDNN's bf16 path), where a bfloat16
    model's matmuls run ~2.5× faster than float32 (12 vs 31 ms for a 512×576 @ 576×1536 product, 1 thread, here)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _statistics_error(found, expected) -> dict:
    """Largest absolute difference per statistic between two runs' per-document statistics, and between their
    corpus means (what the heads table shows)."""
    import numpy as np

    from models.corpus import statistics

    out = {}
    for name in statistics.STATISTICS:
        a = np.stack([d[name] for d in found])
        b = np.stack([d[name] for d in expected])
        with np.errstate(all="ignore"):
            out[name] = {"document_max_abs": float(np.nanmax(np.abs(a - b))),
                         "corpus_mean_max_abs": float(np.nanmax(np.abs(np.nanmean(a, 0) - np.nanmean(b, 0))))}
    return out


def part_throughput(count: int, memory_documents: int, rounds: int = 2) -> dict:
    """Paired and alternating in one process: ours (bfloat16 when the CPU multiplies it natively, and float32) and
    the eager baseline (float32 as a user loads it by default, and bfloat16), each round in that order."""
    import torch
    import transformers

    from bench.measure import rss_bytes
    from models import families
    from models.corpus import engine, statistics
    from models.families.causal_lm.model import smollm2_folder

    torch.set_num_threads(1)
    spec = families.default_spec("causal_lm")
    dtypes = ["bfloat16", "float32"] if bf16_is_fast() else ["float32"]
    loaded = {dtype: families.load(spec, "cpu", dtype) for dtype in dtypes}
    eager = {dtype: transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_folder(), attn_implementation="eager", dtype=getattr(torch, dtype)).eval() for dtype in dtypes}
    corpus = _documents(count)
    runner = statistics.StatisticsRunner(loaded["float32"], 256)
    ids = [runner.tokenize(d) for d in corpus.documents]
    tokens = sum(len(i) for i in ids)
    for dtype in dtypes:  # warm
        statistics.StatisticsRunner(loaded[dtype], 256).run(corpus.documents[:2])
        statistics.eager_statistics(eager[dtype], ids[0])
    # wall time, and the process's CPU time (one torch thread: the work done, which a loaded machine's waiting for a
    # core does not inflate as it does the wall time)
    times = {f"{side}_{dtype}": [] for side in ("ours", "baseline", "forward_only") for dtype in dtypes}
    cpu = {name: [] for name in times}
    results = {}

    def timed(name: str, work):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = work()
        times[name].append(time.perf_counter() - start)
        cpu[name].append(time.process_time() - start_cpu)
        return out

    for _ in range(rounds):
        for dtype in dtypes:
            with tempfile.TemporaryDirectory() as folder:
                timed(f"ours_{dtype}", lambda: engine.run_corpus(corpus, loaded[dtype], folder, max_tokens=256))
            timed(f"forward_only_{dtype}",  # the same forwards, nothing recorded
                  lambda: statistics.StatisticsRunner(loaded[dtype], 256).forward_only(corpus.documents))
            results[dtype] = timed(f"baseline_{dtype}", lambda: [statistics.eager_statistics(eager[dtype], token_ids)
                                                                 for token_ids in ids])
    # what ours computes in each dtype vs the float32 eager maps (the reference)
    errors = {dtype: _statistics_error([d.statistics for d in statistics.StatisticsRunner(
        loaded[dtype], 256).run(corpus.documents)[0]], results["float32"]) for dtype in dtypes}
    del eager
    best = {name: min(values) for name, values in times.items()}
    best_cpu = {name: min(values) for name, values in cpu.items()}
    fastest = dtypes[0]
    rss = []
    with tempfile.TemporaryDirectory() as folder:
        engine.run_corpus(_documents(memory_documents), loaded[fastest], folder, max_tokens=256,
                          progress=lambda p: rss.append(rss_bytes() / MB))
    speedup = best["baseline_float32"] / best[f"ours_{fastest}"]
    return {"case": "corpus_throughput", "documents": count, "tokens": tokens, "rounds": rounds,
            "times_s": times, "tokens_per_s": {name: tokens / value for name, value in best.items()},
            "speedup": speedup, "ours_dtype": fastest,
            "speedup_float32_vs_float32": best["baseline_float32"] / best["ours_float32"],
            **({"speedup_bfloat16_vs_bfloat16": best["baseline_bfloat16"] / best["ours_bfloat16"]}
               if "bfloat16" in dtypes else {}),
            "cpu_s": cpu, "cpu_speedup": best_cpu["baseline_float32"] / best_cpu[f"ours_{fastest}"],
            "cpu_speedup_float32_vs_float32": best_cpu["baseline_float32"] / best_cpu["ours_float32"],
            **({"cpu_speedup_bfloat16_vs_bfloat16": best_cpu["baseline_bfloat16"] / best_cpu["ours_bfloat16"]}
               if "bfloat16" in dtypes else {}),
            # the most any engine that runs the model's forward could reach: the baseline over the bare forward
            "ceiling_speedup": best["baseline_float32"] / best[f"forward_only_{fastest}"],
            "ceiling_speedup_float32": best["baseline_float32"] / best["forward_only_float32"],
            "statistics_error_vs_float32_eager": errors,
            "target": "speedup (ours, fastest dtype, vs float32 eager baseline) >= 3", "ok": speedup >= 3,
            "memory_documents": memory_documents, "rss_mb_per_batch": [round(r) for r in rss],
            "rss_growth_mb": rss[-1] - rss[1] if len(rss) > 2 else None, "threads": 1,
            "load_average_at_end": os.getloadavg()}


def part_ray(count: int) -> dict:
    import ray
    import torch

    from models import families
    from models.corpus import engine

    torch.set_num_threads(2)
    loaded = families.load(families.default_spec("causal_lm"))
    corpus = _documents(count)
    engine.run_corpus(_documents(2), loaded, tempfile.mkdtemp(), max_tokens=256)  # warm
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        engine.run_corpus(corpus, loaded, folder, max_tokens=256)
        local_s = time.perf_counter() - start
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}})
    init_s = time.perf_counter() - start
    arrivals, actor_rss, stop = [], {}, threading.Event()

    def sample_actors() -> None:  # peak RSS of each actor process (Ray titles them after the actor class)
        import psutil

        while not stop.is_set():
            for process in psutil.process_iter(["cmdline", "memory_info"]):
                try:
                    if "CorpusActor" in " ".join(process.info["cmdline"] or []):
                        rss = process.info["memory_info"].rss / MB
                        actor_rss[process.pid] = max(actor_rss.get(process.pid, 0), rss)
                except (TypeError, AttributeError):
                    continue
            stop.wait(0.5)

    sampler = threading.Thread(target=sample_actors, daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        engine.run_corpus(corpus, loaded, folder, engine="ray", max_tokens=256, actors=2,
                          progress=lambda p: arrivals.append((time.perf_counter() - start, p.done, p.tokens)))
        ray_s = time.perf_counter() - start
    stop.set()
    ray.shutdown()
    first_t, first_done, first_tokens = arrivals[1]
    last_t, last_done, last_tokens = arrivals[-1]
    steady = (last_tokens - first_tokens) / max(last_t - first_t, 1e-9)
    return {"case": "corpus_ray", "documents": count, "local_2_threads_s": local_s, "ray_init_s": init_s,
            "ray_s": ray_s, "ray_first_batch_s": first_t, "ray_steady_tokens_per_s": steady,
            "local_tokens_per_s": arrivals[-1][2] / local_s, "ratio": ray_s / local_s,
            "overhead_s": ray_s - local_s, "actor_peak_rss_mb": sorted(round(v) for v in actor_rss.values()),
            "target": "ratio <= 1.3", "ok": ray_s / local_s <= 1.3}


def part_long_side(side: str, n: int) -> dict:
    import torch

    from bench.case_page import long_text
    from bench.measure import measure_memory
    from models import families
    from models.core import memory, text
    from models.core.inputs import TextInput
    from models.families.causal_lm import model as causal_lm

    memory.use_fixed_mmap_threshold()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    loaded = families.load(families.default_spec("causal_lm"))
    inputs = TextInput(long_text(n, seed=0), n)
    if side == "ours":
        causal_lm.run(loaded, TextInput("warm up", 16))
        start = time.perf_counter()
        stats, result = measure_memory(lambda: causal_lm.run(loaded, inputs), "cpu")
        elapsed = time.perf_counter() - start
        maps = result.maps("self")
        qk = sum(a.nbytes for a in maps.queries + maps.keys)
        return {"s": elapsed, **stats, "qk_mb": qk / MB, "mask_mb": sum(a.nbytes for a in maps.allowed_masks) / MB,
                "tokens": len(result.tokens), "qk_dtype": str(maps.queries[0].dtype)}
    import transformers

    from models.families.causal_lm.model import smollm2_folder

    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_folder(), attn_implementation="sdpa").eval()
    ids = torch.tensor([text.tokenize(loaded.tokenizer, inputs.text, n).ids])
    del loaded
    with torch.inference_mode():
        model(input_ids=ids[:, :16], use_cache=False, logits_to_keep=1)

        def forward():
            with torch.inference_mode():
                return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

        start = time.perf_counter()
        stats, _ = measure_memory(forward, "cpu")
        elapsed = time.perf_counter() - start
    return {"s": elapsed, **stats, "tokens": ids.shape[1]}


def part_long(n: int) -> dict:
    sides = {}
    for side in ("sdpa", "ours"):
        done = subprocess.run([sys.executable, "-m", "bench.case_corpus", "--side", side, "--n", str(n)], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        sides[side] = json.loads(done.stdout.strip().splitlines()[-1])
    ours, sdpa = sides["ours"], sides["sdpa"]
    extra = ours["peak_host_mb"] - sdpa["peak_host_mb"]
    return {"case": "long_gpt_page", "n": ours["tokens"], "ours_s": ours["s"], "baseline_s": sdpa["s"],
            "ratio": ours["s"] / sdpa["s"], "extra_mb": extra, "qk_mb": ours["qk_mb"], "mask_mb": ours["mask_mb"],
            "extra_over_qk": extra / ours["qk_mb"], "qk_dtype": ours["qk_dtype"], "ours": ours, "sdpa": sdpa,
            "target": "ratio <= 1.3, extra <= 1.1 x q/k bytes",
            "ok": ours["s"] / sdpa["s"] <= 1.3 and extra <= 1.1 * ours["qk_mb"]}


def part_memory(count: int, batch_documents: int = 8) -> dict:
    """RSS, the Python heap (``tracemalloc``) and pyarrow's pool after each written batch of a local run over
    ``count`` bundled documents, in a process set up as the app and the CLI set theirs up (models/core/memory.py)."""
    import gc
    import tracemalloc

    import pyarrow as pa
    import torch

    from bench.measure import rss_bytes
    from models import families
    from models.core import memory
    from models.corpus import engine

    torch.set_num_threads(1)
    memory.use_fixed_mmap_threshold()
    loaded = families.load(families.default_spec("causal_lm"))
    tracemalloc.start()
    samples = []

    def sample(progress) -> None:
        gc.collect()
        samples.append({"documents": progress.done, "rss_mb": round(rss_bytes() / MB),
                        "python_heap_mb": round(tracemalloc.get_traced_memory()[0] / MB, 1),
                        "pyarrow_pool_mb": round(pa.total_allocated_bytes() / MB, 1)})

    with tempfile.TemporaryDirectory() as folder:
        engine.run_corpus(_documents(count), loaded, folder, max_tokens=256, progress=sample,
                          batch_documents=batch_documents)
    tracemalloc.stop()
    half = [s for s in samples if s["documents"] >= count // 2]
    return {"case": "corpus_memory", "documents": count, "batch_documents": batch_documents, "samples": samples,
            "rss_growth_mb_second_half": half[-1]["rss_mb"] - half[0]["rss_mb"] if half else None,
            "python_heap_growth_mb": samples[-1]["python_heap_mb"] - samples[1]["python_heap_mb"],
            "load_average_at_end": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=["throughput", "ray", "long"])
    parser.add_argument("--documents", type=int, default=48)
    parser.add_argument("--memory-documents", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.side:
        print(json.dumps(part_long_side(args.side, args.n)))
        return
    for part in args.parts:
        if part == "throughput":
            out = part_throughput(args.documents, args.memory_documents, args.rounds)
        elif part == "ray":
            out = part_ray(args.documents)
        elif part == "memory":
            out = part_memory(args.memory_documents)
        else:
            out = part_long(args.n)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
