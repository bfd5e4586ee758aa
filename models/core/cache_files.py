"""The converted-weights cache (``loading.converted_once``): checked before it is trusted, safe against kills, full
disks and a second process converting at the same time.

- Kills: a conversion is written to ``<name>.partial-<pid>-<thread>`` and renamed into place only when complete, so a
  kill leaves a partial folder that is never loaded; ``remove_abandoned`` deletes those of processes no longer alive.
- Damage: ``files.json`` (every file's size, written before the stamp) and the safetensors headers say whether a
  cached folder is whole (a folder without it also has its JSON files parsed); ``damage`` returns why not (a
  truncated ``model.safetensors``, a missing tokenizer, a JSON file cut short), and the caller converts again. A bit flipped inside the tensor data of a same-sized file is not
  detected (that would mean hashing 0.5 GB on every start).
- Full disk: ``ENOSPC`` (from Python or from safetensors' Rust writer) becomes a ``ValueError`` naming the folder,
  what the conversion needs and what is free.
- Two processes (two servers, or the CLI beside a server) share the cache: ``process_lock`` (``flock``) makes them
  convert one at a time, and the second finds the first one's result.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import struct
from pathlib import Path

MANIFEST = "files.json"  # {relative path: size in bytes} of everything the build wrote
STAMP = "converted.json"  # written last: without it a folder is never used


def write_manifest(folder: Path) -> None:
    sizes = {str(path.relative_to(folder)): path.stat().st_size for path in sorted(folder.rglob("*"))
             if path.is_file() and path.name not in (MANIFEST, STAMP)}
    (folder / MANIFEST).write_text(json.dumps(sizes, indent=0))


def _safetensors_damage(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (its header must parse and its tensors end at the file's end)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as file:
            (header_length,) = struct.unpack("<Q", file.read(8))
            if header_length > min(size - 8, 100 * 2**20):
                return f"{path.name} is cut short (its header says {header_length:,} bytes, the file has {size:,})"
            header = json.loads(file.read(header_length))
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        return f"{path.name} has a damaged header ({type(error).__name__})"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + header_length + max(ends, default=0)
    if expected != size:
        return f"{path.name} has {size:,} bytes where its header says {expected:,}"
    return None


def damage(folder: Path) -> str | None:
    """Why a cached conversion in ``folder`` cannot be used, or None when it looks whole (cheap: sizes and headers,
    no hashing). Folders written before the manifest existed are checked by their safetensors and JSON files."""
    manifest = folder / MANIFEST
    if manifest.is_file():
        try:
            sizes = json.loads(manifest.read_text())
        except (OSError, ValueError):
            return f"{MANIFEST} is unreadable"
        for name, size in sizes.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size:,} bytes, {size:,} were written"
    for path in sorted(folder.glob("*.safetensors")):
        if (reason := _safetensors_damage(path)) is not None:
            return reason
    if manifest.is_file():  # every file has the size it was written with: a JSON file cut short is caught above
        return None  # (parsing Gemma 3's 33 MB tokenizer.json again cost 2.8 s on every load)
    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            return f"{path.name} is not valid JSON"
    return None


# --- kills: partial folders of processes that are gone -------------------------------------------------------------

def partial_name(target: Path, thread_id: int) -> Path:
    return target.with_name(f"{target.name}.partial-{os.getpid()}-{thread_id}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_abandoned(target: Path) -> list[Path]:
    """Delete ``<target>.partial-<pid>-*`` folders whose process has died (killed mid-conversion); returns them."""
    pattern = re.compile(re.escape(target.name) + r"\.partial-(\d+)-\d+$")
    removed = []
    for path in target.parent.glob(f"{target.name}.partial-*"):
        match = pattern.match(path.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# --- full disk --------------------------------------------------------------------------------------------------------

def is_disk_full(error: BaseException) -> bool:
    """``ENOSPC``/``EDQUOT`` from Python, or safetensors' Rust writer saying the same in words."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    message = str(error)
    return any(words in message for words in ("No space left on device", "StorageFull", "os error 28",
                                              "Disk quota exceeded"))


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def disk_full_error(folder: Path, what: str, needs_bytes: int | None, started: bool = True) -> ValueError:
    """The message for a full disk (``started``: the conversion ran out of space; else it was not begun)."""
    needs = f" needs about {needs_bytes / 2**20:,.0f} MB and" if needs_bytes else ""
    opening = "The disk is full:" if started else "Not enough disk space:"
    kept = " Nothing half-written was kept." if started else ""
    return ValueError(f"{opening} {what}{needs} {free_bytes(folder) / 2**20:,.0f} MB are free in {folder}. Free "
                      "some space there, or set ATTN_EXPLORER_CACHE to a folder on a disk with room, and reload the "
                      f"page.{kept}")


# --- two processes ----------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def process_lock(path: Path):
    """An exclusive ``flock`` on ``path`` (created), so two processes sharing the cache convert one at a time; a
    no-op where ``fcntl`` does not exist (Windows)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
