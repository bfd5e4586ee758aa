"""Read a model's attention hyper-parameters from the header of a GGUF file, without loading any tensor.

GGUF (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) starts with a header: the magic ``GGUF``, a uint32
version, a uint64 tensor count, a uint64 metadata key/value count, then the key/value pairs — each a length-prefixed
UTF-8 key, a uint32 value type and the value (a little-endian scalar, a uint64-length string, or an array: item
type, uint64 count, items). Tensor infos and tensor data follow the metadata and are never touched here.

Only the metadata is read, and only until the keys we need are known: ``general.architecture`` and, under that
architecture's prefix, ``block_count``, ``attention.head_count``, ``attention.head_count_kv``, ``embedding_length``,
``attention.key_length`` and ``attention.sliding_window`` (Gemma 3's local layers). Versions 2 and later (64-bit
counts and lengths) are supported.
"""
from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO

# GGUF value types (gguf.md, ``enum gguf_metadata_value_type``) with a fixed size, as struct formats.
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                  12: "<d"}
STRING_TYPE, ARRAY_TYPE = 8, 9

# GGUF key under ``<architecture>.`` -> the transformers config attribute it becomes
ATTENTION_KEYS = {"block_count": "num_hidden_layers", "attention.head_count": "num_attention_heads",
                  "attention.head_count_kv": "num_key_value_heads", "embedding_length": "hidden_size",
                  "attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"}
_REQUIRED = {"num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size"}


def _read(handle: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) < size:
        raise ValueError(f"{getattr(handle, 'name', 'the file')} ends inside its GGUF header: it is truncated or "
                         "damaged; download it again")
    return struct.unpack(fmt, data)[0]


def _read_string(handle: BinaryIO) -> str:
    return handle.read(_read(handle, "<Q")).decode("utf-8", "replace")


def _skip_value(handle: BinaryIO, kind: int) -> None:
    if kind == STRING_TYPE:
        handle.seek(_read(handle, "<Q"), 1)
    elif kind == ARRAY_TYPE:
        item_kind, count = _read(handle, "<I"), _read(handle, "<Q")
        if item_kind in SCALAR_FORMATS:  # fixed-size items: one seek over the whole array
            handle.seek(struct.calcsize(SCALAR_FORMATS[item_kind]) * count, 1)
        else:
            for _ in range(count):
                _skip_value(handle, item_kind)
    elif kind in SCALAR_FORMATS:
        handle.seek(struct.calcsize(SCALAR_FORMATS[kind]), 1)
    else:
        raise ValueError(f"unknown GGUF value type {kind}; the file is damaged or newer than this reader")


def gguf_attention_config(path: str | Path) -> SimpleNamespace:
    """Layers, heads, KV heads and widths from a GGUF file's metadata, read in order and stopped as soon as they are
    known — the 49k-entry tokenizer arrays that follow are never parsed. Attribute names follow transformers configs
    (``model_type``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``hidden_size``,
    ``head_dim`` when the file gives it)."""
    found: dict[str, Any] = {}
    arch = None
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version = _read(handle, "<I")
        if version < 2:
            raise ValueError(f"{path} is GGUF version {version}; only versions 2 and later are read")
        _read(handle, "<Q")  # tensor count
        for _ in range(_read(handle, "<Q")):  # metadata key/value count
            key = _read_string(handle)
            in_arch_block = arch is not None and key.startswith(arch + ".")
            if not in_arch_block and _REQUIRED <= found.keys():
                break  # the architecture's keys are contiguous: past them, nothing more is needed
            kind = _read(handle, "<I")
            name = key[len(arch) + 1:] if in_arch_block else None
            if key == "general.architecture" and kind == STRING_TYPE:
                arch = _read_string(handle)
            elif name in ATTENTION_KEYS and kind in SCALAR_FORMATS:
                found[ATTENTION_KEYS[name]] = _read(handle, SCALAR_FORMATS[kind])
            else:
                _skip_value(handle, kind)
    if "num_hidden_layers" not in found or "num_attention_heads" not in found:
        raise ValueError(f"{path} does not say how many layers and heads it has")
    return SimpleNamespace(model_type=arch, **found)
