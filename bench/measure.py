"""Memory probes and timing helpers shared by every case of ``python -m bench.run``.

Memory: ``measure_memory`` runs a function once and reports its peak above the level just before it, in MB. On CPU
that is peak RSS: the kernel's counter is reset through ``/proc/self/clear_refs`` and read back as ``VmHWM``
(Linux ≥ 4.0); on GPU it is ``torch.cuda.max_memory_allocated``. Peak RSS also counts memory the C allocator keeps
after a free, so callers measure in fresh processes and compare medians.

Timing: ours and the baseline run in one process, back to back and alternating in order (``alternate``); ``paired``
gives the median times and the median of the per-repeat ratios, so a burst of load on a shared machine hits one pair,
not one side of every comparison.
"""
from __future__ import annotations

import gc
import os
import time

MB = 2**20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS counter (VmHWM) to the current RSS (Linux ≥ 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure_memory(fn, device: str) -> tuple[dict, object]:
    """Run ``fn()`` once; peak memory above the level before it (MB), and what stays held while its result lives."""
    import torch

    from models.core import memory

    gc.collect()
    # freed heap back to the OS first: memory freed while the model was built would otherwise be reused without
    # raising RSS, and the peak above the start would be under-counted
    memory.release_freed_heap()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before_gpu = torch.cuda.memory_allocated()
    before = rss_bytes()
    reset_peak_rss()
    result = fn()
    peak = peak_rss_bytes()
    out = {"peak_host_mb": (peak - before) / MB, "held_host_mb": (rss_bytes() - before) / MB}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        out["peak_gpu_mb"] = (torch.cuda.max_memory_allocated() - before_gpu) / MB
        out["held_gpu_mb"] = (torch.cuda.memory_allocated() - before_gpu) / MB
    out["peak_mb"] = out.get("peak_gpu_mb", out["peak_host_mb"])
    return out, result


def timed(fn, device: str) -> float:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def paired(ours: list[float], baseline: list[float]) -> tuple[float, float, float]:
    """(median ours, median baseline, median of the per-repeat ratios): each repeat times both back to back, so a
    burst of load from other users hits one pair, not one side of every comparison."""
    import statistics

    return (statistics.median(ours), statistics.median(baseline),
            statistics.median(o / b for o, b in zip(ours, baseline)))


def alternate(ours, baseline, repeats: int, device: str) -> tuple[list[float], list[float]]:
    """Time ``ours`` and ``baseline`` alternately (the order flips every repeat) so load changes hit both."""
    ours_s, base_s = [], []
    for r in range(repeats):
        pair = [(ours, ours_s), (baseline, base_s)]
        for fn, samples in (pair if r % 2 else pair[::-1]):
            samples.append(timed(fn, device))
    return ours_s, base_s
