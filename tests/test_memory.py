"""Allocator set-up (models/core/memory.py): with the app's fixed mmap threshold, a long input's freed activations go back
to the operating system instead of staying pinned in the heap, and ``release_freed_heap`` returns what small blocks
left free in the heap."""
import subprocess
import sys
from pathlib import Path


from models.core import memory

MB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
def no_glibc_here() -> bool:
    """Without glibc (macOS, musl) there is nothing to set up: the functions must say so and do nothing, which is
    what the glibc tests check there instead of skipping."""
    if memory._glibc():
        return False
    assert not memory.use_fixed_mmap_threshold() and not memory.release_freed_heap()
    return True


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
from models.core import memory
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


def test_large_blocks_get_their_own_mapping_returned_on_free():
    if no_glibc_here():
        return
    size, name, gone = probe(fixed=True)
    # its own anonymous mapping (whose size says little: the kernel merges neighbouring anonymous mappings)
    assert name != "[heap]" and size >= 4 * MB, (size, name)
    assert gone  # unmapped, back to the OS, the moment it was freed
    size, name, gone = probe(fixed=False)  # what the app avoids: glibc's default puts it in the heap, kept
    assert name == "[heap]" and not gone


def heap_resident() -> int:
    """Bytes of the ``[heap]`` mapping that are in RAM (its ``Rss`` in /proc/self/smaps); 0 if there is none."""
    in_heap = False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0]:  # a mapping's header line: "start-end perms offset dev inode [name]"
                in_heap = fields[-1] == "[heap]"
            elif in_heap and fields[0] == "Rss:":
                return int(fields[1]) * 1024
    return 0


TRIM_PROBE = """
import ctypes, sys
sys.path.insert(0, {root!r})
from models.core import memory
from tests.test_memory import heap_resident
memory.use_fixed_mmap_threshold()  # as the app runs: blocks under 1 MB still come from the heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
sizes = [(4 + i % 29) * 1024 for i in range(10_000)]  # 4-32 KB each, 176 MB in all: a forward pass's small tensors
before = heap_resident()
blocks = [libc.malloc(n) for n in sizes]
for block, n in zip(blocks, sizes):
    ctypes.memset(block, 1, n)  # touched: resident, as tensors are
live = heap_resident()
for block in blocks[:-1]:
    libc.free(block)  # the last block stays, above the others, as a kept result does: the heap cannot shrink
freed = heap_resident()
released = memory.release_freed_heap() if {trim} else None
print(before, live, freed, heap_resident(), released)
"""


def trim_probe(trim: bool) -> tuple[int, int, int, int, str]:
    """In a fresh process (see ``probe``): the heap's resident bytes before 176 MB of small blocks, with them live,
    once all but the topmost are freed, and after ``release_freed_heap`` if ``trim``; and what it returned."""
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE.format(root=str(ROOT), trim=trim)], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2]), int(out[3]), out[4]


def test_release_freed_heap_returns_freed_small_blocks_to_the_os():
    if no_glibc_here():
        return
    before, live, freed, trimmed, released = trim_probe(trim=True)
    assert live - before > 150 * MB, (before, live)  # the blocks really sat in the heap
    assert freed > live - 16 * MB, (live, freed)  # free() alone keeps them: a live block sits above them
    assert freed - trimmed > 150 * MB, (freed, trimmed)  # malloc_trim gave them back
    assert released == "True"
    before, live, freed, kept, released = trim_probe(trim=False)  # the control: without the call they stay
    assert kept > live - 16 * MB, (live, kept)


def test_without_glibc_both_are_no_ops(monkeypatch):
    monkeypatch.setattr(memory, "_libc", False)
    assert memory.release_freed_heap() is False
    assert memory.use_fixed_mmap_threshold() is False
