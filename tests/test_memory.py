"""Allocator set-up (models/memory.py): with the app's fixed mmap threshold, a long input's freed activations go back
to the operating system instead of staying pinned in the heap."""
import sys

import pytest
import torch

from models import memory

MB = 1 << 20
glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or not memory._glibc(), reason="glibc only")


def mapping_of(address: int) -> tuple[int, str] | None:
    """(size in bytes, name) of the memory mapping holding ``address``, from /proc/self/maps; None if unmapped."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return end - start, fields[5] if len(fields) > 5 else ""
    return None


@glibc_only
def test_large_blocks_get_their_own_mapping_returned_on_free():
    """Checked on the mappings, not on RSS (other threads of a long test session move RSS by tens of MB)."""
    assert memory.use_fixed_mmap_threshold()
    freed = torch.ones(16 * MB, dtype=torch.uint8)
    del freed  # with glibc's default this free raises its threshold to 16 MB: 4 MB blocks would then use the heap
    block = torch.ones(4 * MB, dtype=torch.uint8)  # an "activation"
    live = torch.ones(1024)  # a small block that stays, as kept results do
    address = block.data_ptr()
    size, name = mapping_of(address)
    # not the heap, not a 64 MB thread arena (the kernel may merge it with a neighbouring anonymous mapping)
    assert name != "[heap]" and 4 * MB <= size < 16 * MB, (size, name)
    del block
    assert mapping_of(address) is None  # gone back to the OS the moment it was freed
    assert live.numel() == 1024


@glibc_only
def test_release_freed_heap_runs():
    assert isinstance(memory.release_freed_heap(), bool)


def test_without_glibc_both_are_no_ops(monkeypatch):
    monkeypatch.setattr(memory, "_libc", False)
    assert memory.release_freed_heap() is False
    assert memory.use_fixed_mmap_threshold() is False
