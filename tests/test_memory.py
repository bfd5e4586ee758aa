"""Allocator set-up (models/memory.py): with the app's fixed mmap threshold, a long input's freed activations go back
to the operating system instead of staying pinned in the heap."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import memory

MB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
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


PROBE = """
import sys, torch
sys.path.insert(0, {root!r})
from models import memory
from tests.test_memory import MB, mapping_of
if {fixed}:
    assert memory.use_fixed_mmap_threshold()
freed = torch.ones(16 * MB, dtype=torch.uint8)
del freed  # with glibc's default this free raises its threshold to 16 MB: 4 MB blocks then come from the heap
block = torch.ones(4 * MB, dtype=torch.uint8)  # an "activation"
live = torch.ones(1024)  # a small block that stays, as kept results do
address = block.data_ptr()
size, name = mapping_of(address)
del block
print(size, name or "anonymous", mapping_of(address) is None)
"""


def probe(fixed: bool) -> tuple[int, str, bool]:
    """In a fresh process: a heap that has free chunks from earlier work serves requests from them whatever the
    threshold (glibc maps only what would grow the heap), so this test's own process is no clean slate."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), fixed=fixed)], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), out[1], out[2] == "True"


@glibc_only
def test_large_blocks_get_their_own_mapping_returned_on_free():
    size, name, gone = probe(fixed=True)
    # its own anonymous mapping (whose size says little: the kernel merges neighbouring anonymous mappings)
    assert name != "[heap]" and size >= 4 * MB, (size, name)
    assert gone  # unmapped, back to the OS, the moment it was freed
    size, name, gone = probe(fixed=False)  # what the app avoids: glibc's default puts it in the heap, kept
    assert name == "[heap]" and not gone


@glibc_only
def test_release_freed_heap_runs():
    assert isinstance(memory.release_freed_heap(), bool)


def test_without_glibc_both_are_no_ops(monkeypatch):
    monkeypatch.setattr(memory, "_libc", False)
    assert memory.release_freed_heap() is False
    assert memory.use_fixed_mmap_threshold() is False
