"""Allocator set-up (models/memory.py): with the app's fixed mmap threshold, a long input's freed activations go back
to the operating system instead of staying pinned in the heap."""
import sys

import pytest
import torch

from models import memory

MB = 1 << 20
glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or not memory._glibc(), reason="glibc only")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@glibc_only
def test_freed_activations_return_to_the_os_with_the_fixed_threshold():
    assert memory.use_fixed_mmap_threshold()
    freed = torch.ones(16 * MB, dtype=torch.uint8)
    del freed  # with glibc's default this free raises its threshold to 16 MB: 4 MB blocks would then use the heap
    before = rss()
    blocks = [torch.ones(4 * MB, dtype=torch.uint8) for _ in range(16)]  # 64 MB of "activations"
    live = [torch.ones(1024) for _ in range(64)]  # small blocks that stay, as kept results do
    during = rss()
    del blocks
    after = rss()
    assert during - before > 60 * MB
    assert after - before < 8 * MB, f"{(after - before) / MB:.0f} MB still held after the blocks were freed"
    assert len(live) == 64


@glibc_only
def test_release_freed_heap_runs():
    assert isinstance(memory.release_freed_heap(), bool)


def test_without_glibc_both_are_no_ops(monkeypatch):
    monkeypatch.setattr(memory, "_libc", False)
    assert memory.release_freed_heap() is False
    assert memory.use_fixed_mmap_threshold() is False
