"""Marian's binary model format (``model.*.bin``: marian-dev ``src/common/binary.cpp``), read and written.

Layout, all little-endian:

    uint64 version (1), uint64 n
    n × (uint64 name length, uint64 type, uint64 shape length, uint64 data length)
    the n names (NUL-terminated, their lengths include the NUL), then the n shapes (int32 each)
    uint64 padding, then that many bytes (the data starts on a 256-byte boundary)
    the n data blocks, one after another, each ``data length`` bytes (padded to a multiple of 256)

Types (marian ``Type``: a class in the high byte, the element size in the low one): float32 ``0x0404``, float16
``0x0402``, int8 ``0x0101`` (the ``special:model.yml`` text is one), and **intgemm8** ``0x4101``: an int8 matrix
``q`` followed by one float32 ``m`` (intgemm's quantisation multiplier, ``q = round(w · m)``, so ``w = q / m``).
The int8 matrix of a weight that multiplies activations from the right (``x · W``: a name ending in ``_W`` or
``_W`` and one character, ``encoder_l1_self_Wq``, ``decoder_l1_rnn_W``) is stored *transposed*, ``(columns, rows)``
row-major, as intgemm's B operand is prepared; any other (the embedding matrix ``Wemb``, read by rows) is stored as
the header's shape says. Neither is assumed: read as the header's shape, the transposed ones translate "How are you
today?" into "de de de …"; read as described, the translations equal the package's own engine word for word
(``bench/case_translator.py``: the parity counts; ``tests/test_bergamot.py``), and the tests here write files of
known floats and read them back.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FLOAT32, FLOAT16, INT8, INTGEMM8 = 0x0404, 0x0402, 0x0101, 0x4101
TYPE_NAMES = {FLOAT32: "float32", FLOAT16: "float16", INT8: "int8", INTGEMM8: "intgemm8"}
ALIGNMENT = 256  # marian aligns the data start and every block to 256 bytes
MODEL_CONFIG = "special:model.yml"


@dataclass(frozen=True)
class Item:
    """One named tensor as stored: ``values`` float32 (dequantised for intgemm8; the raw bytes for int8 text),
    ``multiplier`` intgemm8's quantisation multiplier (None for other types)."""

    name: str
    type: int
    shape: tuple[int, ...]
    values: np.ndarray
    multiplier: float | None = None

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, hex(self.type))


def _padded(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


def stored_transposed(name: str, shape: tuple[int, ...]) -> bool:
    """Whether marian stores this intgemm8 matrix transposed: a right-hand weight ``…_W`` or ``…_W?``."""
    return len(shape) == 2 and (name.endswith("_W") or name[:-1].endswith("_W"))


def _decode(name: str, kind: int, shape: tuple[int, ...], block: memoryview) -> Item:
    count = int(np.prod(shape)) if shape else 1
    if kind == FLOAT32:
        return Item(name, kind, shape, np.frombuffer(block, "<f4", count).reshape(shape).copy())
    if kind == FLOAT16:
        return Item(name, kind, shape, np.frombuffer(block, "<f2", count).astype(np.float32).reshape(shape))
    if kind == INT8:
        return Item(name, kind, shape, np.frombuffer(block, np.int8, count).reshape(shape).copy())
    if kind == INTGEMM8:
        if len(block) < count + 4:
            raise ValueError(f"{name}: an intgemm8 block of {len(block)} bytes cannot hold {count} int8 values "
                             "and their float32 multiplier")
        quantised = np.frombuffer(block, np.int8, count)
        quantised = quantised.reshape(shape[::-1]).T if stored_transposed(name, shape) else quantised.reshape(shape)
        (multiplier,) = struct.unpack_from("<f", block, count)
        if not np.isfinite(multiplier) or multiplier <= 0:
            raise ValueError(f"{name}: its quantisation multiplier {multiplier!r} is not a positive number")
        return Item(name, kind, shape, quantised.astype(np.float32) / np.float32(multiplier), float(multiplier))
    raise ValueError(f"{name}: Marian type {hex(kind)} is not read here (float32, float16, int8 and intgemm8 are)")


def read(path: str | Path) -> dict[str, Item]:
    """Every item of a Marian binary model file by name, in file order; a file that is not one raises ValueError
    saying where it stops making sense."""
    data = memoryview(Path(path).read_bytes())
    where = Path(path).name
    if len(data) < 16:
        raise ValueError(f"{where} is too short to be a Marian binary model ({len(data)} bytes)")
    version, count = struct.unpack_from("<QQ", data, 0)
    if version != 1:
        raise ValueError(f"{where}: Marian binary format version {version} (this reader knows version 1)")
    offset = 16
    if count > 100_000 or offset + 32 * count > len(data):
        raise ValueError(f"{where}: a header of {count} items does not fit in the file")
    headers = np.frombuffer(data, "<u8", 4 * count, offset).reshape(count, 4).astype(np.int64)
    offset += 32 * count
    names = []
    for length in headers[:, 0]:
        names.append(bytes(data[offset:offset + length]).rstrip(b"\0").decode("utf-8"))
        offset += int(length)
    shapes = []
    for length in headers[:, 2]:
        shapes.append(tuple(int(n) for n in np.frombuffer(data, "<i4", int(length), offset)))
        offset += 4 * int(length)
    (padding,) = struct.unpack_from("<Q", data, offset)
    offset += 8 + padding
    items = {}
    for name, (_, kind, _, length), shape in zip(names, headers, shapes):
        if offset + length > len(data):
            raise ValueError(f"{where} ends inside {name} (truncated?)")
        items[name] = _decode(name, int(kind), shape, data[offset:offset + length])
        offset += int(length)
    return items


def model_config(items: dict[str, Item]) -> dict:
    """The model's options as stored in the file (``special:model.yml``), parsed as YAML."""
    import yaml

    if MODEL_CONFIG not in items:
        raise ValueError("this Marian model file stores no configuration (special:model.yml)")
    text = items[MODEL_CONFIG].values.tobytes().rstrip(b"\0").decode("utf-8")
    return yaml.safe_load(text)


def quantise(weights: np.ndarray) -> tuple[np.ndarray, float]:
    """intgemm's 8-bit quantisation of a float matrix: ``(round(w · m) clipped to ±127, m = 127 / max|w|)``."""
    multiplier = 127.0 / float(np.abs(weights).max())
    quantised = np.clip(np.rint(weights.astype(np.float32) * np.float32(multiplier)), -127, 127).astype(np.int8)
    return quantised, multiplier


def write(path: str | Path, items: list[tuple[str, int, np.ndarray]]) -> None:
    """Write ``(name, type, array)`` items in Marian's binary format (the reader's inverse; intgemm8 arrays are
    quantised with ``quantise``, int8 arrays written as they are). For tests and for checking the reader."""
    blocks = []
    for name, kind, array in items:
        if kind == FLOAT32:
            raw = np.ascontiguousarray(array, "<f4").tobytes()
        elif kind == FLOAT16:
            raw = np.ascontiguousarray(array, "<f2").tobytes()
        elif kind == INT8:
            raw = np.ascontiguousarray(array, np.int8).tobytes()
        elif kind == INTGEMM8:
            quantised, multiplier = quantise(array)
            raw = np.ascontiguousarray(quantised.T if stored_transposed(name, array.shape) else quantised).tobytes()
            raw += struct.pack("<f", multiplier)
        else:
            raise ValueError(f"{name}: Marian type {hex(kind)} is not written here")
        blocks.append((name.encode() + b"\0", kind, tuple(array.shape), raw + b"\0" * (_padded(len(raw)) - len(raw))))
    head = struct.pack("<QQ", 1, len(blocks))
    head += b"".join(struct.pack("<QQQQ", len(n), k, len(s), len(r)) for n, k, s, r in blocks)
    head += b"".join(n for n, _, _, _ in blocks)
    head += b"".join(struct.pack(f"<{len(s)}i", *s) for _, _, s, _ in blocks)
    padding = _padded(len(head) + 8) - (len(head) + 8)
    head += struct.pack("<Q", padding) + b"\0" * padding
    Path(path).write_bytes(head + b"".join(r for _, _, _, r in blocks))
