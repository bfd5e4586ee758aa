"""Softmax attention against linear attention: measured time and peak memory against the sequence length N.

    OMP_NUM_THREADS=1 nice -n 10 python -m bench.case_linear_attention --out sample_data/measured/linear_attention.json

One head, d_k = d_v = 64, float32 numpy, one thread, random Q, K, V. Softmax materialises the N × N scores
(``models.lessons.linear_attention.softmax_attention``'s order); linear attention sums φ(K)ᵀV first
(``models.lessons.linear_attention.linear_attention``'s order), so nothing grows like N². Time: median of ``--repeats`` calls;
memory: the peak of numpy's allocations during one call (``tracemalloc`` sees every numpy buffer), above the inputs.
The mechanics page draws the shipped file; this command rewrites it.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
import tracemalloc
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "sample_data" / "measured" / "linear_attention.json"


def softmax_float32(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    scores = (q @ k.T) * np.float32(1.0 / np.sqrt(q.shape[1]))  # (N, N): the quadratic part
    scores -= scores.max(axis=1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=1, keepdims=True)
    return scores @ v


def linear_float32(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    phi_q = np.where(q > 0, q + 1, np.exp(np.minimum(q, 0)))  # elu + 1, (N, d)
    phi_k = np.where(k > 0, k + 1, np.exp(np.minimum(k, 0)))
    kv = phi_k.T @ v  # (d, d): the whole sequence summarised
    return (phi_q @ kv) / (phi_q @ phi_k.sum(axis=0))[:, None]


def measure(function, n: int, d: int, repeats: int) -> dict:
    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(3))
    function(q[:8], k[:8], v[:8])  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(q, k, v)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    tracemalloc.reset_peak()
    function(q, k, v)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"seconds": sorted(times)[len(times) // 2], "peak_bytes": int(peak)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--softmax-max", type=int, default=8192, help="longest N for softmax (N² floats)")
    args = parser.parse_args(argv)
    rows = []
    for n in args.lengths:
        for name, function in (("softmax", softmax_float32), ("linear", linear_float32)):
            if name == "softmax" and n > args.softmax_max:
                continue
            row = {"method": name, "tokens": n, **measure(function, n, args.d, args.repeats)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"command": "OMP_NUM_THREADS=1 nice -n 10 python -m bench.case_linear_attention",
              "settings": {"d_k": args.d, "d_v": args.d, "heads": 1, "dtype": "float32", "threads": 1,
                           "repeats": args.repeats, "library": f"numpy {np.__version__}"},
              "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
