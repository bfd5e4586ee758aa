"""Long inputs and speed, measured side by side: ``python -m bench.run [--cases ...] [--device cpu cuda]``.

Prints one JSON line per case (and device) with at least ``{"case", "n", "ours_s", "baseline_s", "ratio", "extra_mb",
"bytes"}``; ``ok`` says whether the issue's target was met (``target`` names it). The first line describes the
machine. What each case measures, and against what, is in its module:

- ``causal_lm`` (n = 512, 1024, 2048): ``bench/case_causal_lm.py``, GPT-2-small shape, capture path vs SDPA forward;
- ``view_bytes``, ``rerender`` (n = 1024): ``bench/case_page.py``, the GPT page in ``AppTest``, one run for both;
- ``vit_rollout``: ``bench/case_vit.py`` (timing in ``bench/vit_rollout.py``), ViT-B/16 rollout vs fused forward;
- ``startup``: ``bench/case_startup.py``, ``streamlit run`` to the first chart in headless Chromium;
- ``lens`` (n = 512), ``ablation`` (~20 tokens): ``bench/case_lens.py``, the logit lens on SmolLM2 against the
  forward it reads, all 270 heads ablated one at a time; ``patching`` (12 tokens): a clean/corrupted pair patched
  at every layer and position and for every head;
- ``gemma`` (n = 2,048): ``bench/case_gemma.py``, Gemma 3 270M's real weights through the GPT page's run against
  its SDPA forward;
- ``speech``: ``bench/case_speech.py``, a 10 s clip transcribed by Whisper tiny.en with every map captured against
  the plain SDPA transcription;
- ``captioning``: ``bench/case_captioning.py``, the three captioning minis (caption + every word's maps) and a
  SmolVLM-256M-shaped model (a 20-token caption with maps against plain generation, the maps' bytes);
- ``why``: ``bench/case_why.py``, one cell's score decomposition and a head's composition table on SmolLM2 at 1,024
  tokens, after the page's run (issue 37);
- ``architectures``: ``bench/case_architectures.py``, the GPT page's run on Llama-, Gemma-2-, gpt-oss- and
  BLOOM-shaped models (SDPA, soft caps and sinks through the model's eager math, the eager path) at 1,024 tokens;
- ``load``: ``bench/case_load.py``, 8 headless Chromium sessions × 4 rounds on the real server's GPT page (the
  lecture hall: ``python -m bench.case_load --sessions 16 --minutes 5``);
- ``notebook``: ``bench/case_notebook.py``, ``explore(model, tokenizer, text)`` on an in-memory SmolLM2 at 1,024
  tokens against its plain forward, and a figure's build and render time (2 threads);
- ``long_context`` (only when named: ``--cases long_context --device cuda``): ``bench/case_long_context.py``, the GPT
  page's run and every view of a long prompt (N up to 131,072, Llama-3.2-1B's shape in bfloat16 on CUDA; SmolLM2
  at 8,192 and 32,768 on CPU) against the SDPA forward, one JSON line per device and N.

Memory probes and the paired, alternating timing are in ``bench/measure.py``. Each measurement runs in a fresh
process (``bench/worker.py`` → ``python -m bench.run --worker JOB`` → ``run_worker``), set up as the app sets its
process up. Threads: ``--threads`` (1 by default, so the benchmark leaves the other cores to the people sharing the
machine).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/run.py` as well as `-m bench.run`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.case_captioning import (  # noqa: E402
    case_captioning,
    task_captioning_minis,
    task_captioning_vlm,
)
from bench.case_causal_lm import (  # noqa: E402
    case_causal_lm,
    task_causal_lm_memory,
    task_causal_lm_time,
)
from bench.case_gemma import case_gemma, task_gemma_memory, task_gemma_time  # noqa: E402
from bench.case_lens import (  # noqa: E402
    case_ablation,
    case_lens,
    case_patching,
    task_ablation,
    task_lens,
    task_patching,
)
from bench.case_long_context import case_long_context, task_long_context  # noqa: E402
from bench.case_notebook import case_notebook, task_notebook  # noqa: E402
from bench.case_page import case_page, task_page  # noqa: E402
from bench.case_speech import case_speech, task_speech  # noqa: E402
from bench.case_startup import case_startup  # noqa: E402
from bench.case_vit import case_vit_rollout, task_vit_memory, task_vit_time  # noqa: E402
from bench.case_why import case_why, task_why  # noqa: E402
from bench.case_architectures import case_architectures, task_architectures  # noqa: E402

CASES = ("causal_lm", "view_bytes", "rerender", "vit_rollout", "startup", "lens", "ablation", "patching",
         "speech", "captioning", "translator", "load", "why", "architectures", "notebook", "gemma")
# bench/case_long_context.py: N up to 131,072 on a GPU, 32,768 on a CPU (tens of minutes there): only when asked for
LONG_CASES = ("long_context",)
TASKS = {"causal_lm_time": task_causal_lm_time, "causal_lm_memory": task_causal_lm_memory,
         "vit_time": task_vit_time, "vit_memory": task_vit_memory, "page": task_page,
         "lens": task_lens, "ablation": task_ablation, "patching": task_patching}
TASKS["speech"] = task_speech
TASKS.update(captioning_minis=task_captioning_minis, captioning_vlm=task_captioning_vlm)
TASKS["long_context"] = task_long_context
TASKS["why"] = task_why
TASKS["architectures"] = task_architectures
TASKS["notebook"] = task_notebook
TASKS.update(gemma_time=task_gemma_time, gemma_memory=task_gemma_memory)


def allocator() -> str:
    """``app`` (default): workers set glibc's allocator up as the app does (models/core/memory.py); ``default``: glibc's
    defaults (``ATTN_BENCH_ALLOCATOR=default``), to see what that set-up changes."""
    return os.environ.get("ATTN_BENCH_ALLOCATOR", "app")


def run_worker(job: dict) -> None:
    if job["task"] == "long_context":  # as the server sets its process up (app/server_cpu.quiet_openmp), before
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # PyTorch starts OpenMP: idle threads sleep
    import torch

    from models.core import memory

    torch.set_num_threads(job.get("threads", 1))
    if allocator() == "app":  # the app's process set-up (app/main.py), for ours and the baseline alike
        memory.use_fixed_mmap_threshold()
    print(json.dumps(TASKS[job["task"]](job)), flush=True)


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "load_1min": os.getloadavg()[0], "python": platform.python_version(),
            "torch": torch.__version__}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=CASES + LONG_CASES, default=list(CASES))
    parser.add_argument("--n", nargs="+", type=int, default=[512, 1024, 2048], help="causal_lm lengths")
    parser.add_argument("--page-n", type=int, default=1024, help="tokens for view_bytes and rerender")
    parser.add_argument("--device", nargs="+", default=None, help="default: cpu, and cuda when present")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-repeats", type=int, default=3, help="fresh processes per memory measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the machine may be shared)")
    parser.add_argument("--long-n", nargs="+", type=int, default=None,
                        help="long_context lengths (default: 4,096 … 131,072 on CUDA, 8,192 and 32,768 on CPU)")
    parser.add_argument("--long-shape", choices=("llama-1b", "smollm2", "tiny"), default=None,
                        help="long_context model (default: Llama-3.2-1B's shape on CUDA, SmolLM2 on CPU; tiny: a "
                             "dry run of the code path)")
    parser.add_argument("--cpu-statistics-max-n", type=int, default=8192,
                        help="long_context on CPU: time the all-heads statistics up to this many tokens")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(json.loads(args.worker))
        return
    import torch

    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    print(json.dumps({"case": "machine", **machine(), "devices": devices, "allocator": allocator()}), flush=True)
    for case in args.cases:
        try:
            run_case(case, args, devices)
        except Exception as error:  # one failed case must not hide the others' numbers
            print(json.dumps({"case": case, "error": f"{type(error).__name__}: {str(error)[-2000:]}"}), flush=True)


def run_case(case: str, args, devices: list[str]) -> None:
    """Print the JSON line(s) of one case; view_bytes and rerender share one run of the page."""
    if case == "causal_lm":
        for device in devices:
            for n in args.n:
                print(json.dumps(case_causal_lm(n, device, args.repeats, args.threads, args.memory_repeats)),
                      flush=True)
    elif case == "vit_rollout":
        for device in devices:
            print(json.dumps(case_vit_rollout(device, args.repeats, args.threads)), flush=True)
    elif case == "view_bytes" or (case == "rerender" and "view_bytes" not in args.cases):
        page_cases = [c for c in args.cases if c in ("view_bytes", "rerender")]
        for row in case_page(args.page_n, args.threads, page_cases):
            print(json.dumps(row), flush=True)
    elif case == "lens":
        for device in devices:
            print(json.dumps(case_lens(512, device, args.repeats, args.threads)), flush=True)
    elif case == "ablation":
        for device in devices:
            print(json.dumps(case_ablation(device, args.repeats, args.threads)), flush=True)
    elif case == "patching":
        for device in devices:
            print(json.dumps(case_patching(device, args.repeats, args.threads)), flush=True)
    elif case == "speech":
        for device in devices:
            print(json.dumps(case_speech(device, args.repeats, args.threads)), flush=True)
    elif case == "captioning":  # the targets are on 2 cores
        for row in case_captioning(args.repeats, max(2, args.threads)):
            print(json.dumps(row), flush=True)
    elif case == "long_context":
        for device in devices:
            for row in case_long_context(device, args.long_n, args.repeats, args.threads, args.cpu_statistics_max_n,
                                         args.long_shape):
                print(json.dumps(row), flush=True)
    elif case == "gemma":
        for device in devices:
            print(json.dumps(case_gemma(device, args.repeats, args.threads)), flush=True)
    elif case == "translator":  # parity on 1 thread; the speed target is on 2 cores (the case sets both)
        from bench.case_translator import case_translator

        for row in case_translator():
            print(json.dumps(row, ensure_ascii=False), flush=True)
    elif case == "notebook":  # the target is on 2 cores
        print(json.dumps(case_notebook(1024, args.repeats, max(2, args.threads))), flush=True)
    elif case == "startup":
        print(json.dumps(case_startup(max(1, min(args.repeats, 2)))), flush=True)
    elif case == "why":
        for device in devices:
            print(json.dumps(case_why(device, args.repeats, args.threads, args.memory_repeats)), flush=True)
    elif case == "architectures":  # CPU only: the paths differ by architecture, not by device
        for row in case_architectures(1024, args.repeats, args.threads):
            print(json.dumps(row), flush=True)
    elif case == "load":
        from bench.case_load import run_load

        print(json.dumps(run_load(sessions=8, rounds=4, pages=("gpt",))), flush=True)


if __name__ == "__main__":
    main()
