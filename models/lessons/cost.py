"""What attention costs in memory: the N² attention maps, FlashAttention's O(N), and the KV cache.

- Attention maps: every head of every layer scores every query against every key, so a batch holds
  ``B · L · H · N²`` probabilities (Vaswani et al. 2017); at ``b`` bytes each that is ``B · L · H · N² · b`` bytes.
- FlashAttention (Dao et al. 2022; FlashAttention-2, Dao 2023) tiles Q, K, V through on-chip SRAM with an online
  softmax and never writes the N×N matrix to GPU memory; besides the output it keeps one float32 logsumexp per query
  row and head for the backward pass: ``B · L · H · N · 4`` bytes, O(N).
- KV cache (autoregressive decoding keeps every past key and value): per token and layer ``2 · H_kv · d_head``
  elements — MHA (H_kv = H), GQA (Ainslie et al. 2023, 1 < H_kv < H), MQA (Shazeer 2019, H_kv = 1) — or, for
  multi-head latent attention (MLA, DeepSeek-V2 2024), the compressed latent plus the decoupled RoPE key:
  ``d_c + d_h^R`` elements (kv_lora_rank + qk_rope_head_dim).

Every worked example below is computed by these functions, never typed in. Sizes are shown in decimal units (kB, MB,
GB: powers of 1000) and binary units (KiB, MiB, GiB: powers of 1024) with thousands separators.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.core.gguf import gguf_attention_config

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "float64": 8}
FLASH_STATISTIC_BYTES = 4  # one float32 logsumexp per query row and head
_DECIMAL = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


# --- formatting --------------------------------------------------------------------------------------------------

def thousands(n: int) -> str:
    """``38809`` -> ``'38,809'``."""
    return f"{int(n):,}"


def tex_thousands(n: int) -> str:
    """Thousands separators inside LaTeX (a bare comma would add space): ``38809`` -> ``'38{,}809'``."""
    return thousands(n).replace(",", "{,}")


def _scaled(n: float, base: int, units: tuple[str, ...]) -> str:
    power = 0
    while n >= base and power < len(units) - 1:
        n /= base
        power += 1
    text = f"{n:,.2f}".rstrip("0").rstrip(".") if power else f"{int(n):,}"
    return f"{text} {units[power]}"


def decimal_bytes(n: int) -> str:
    """Bytes in powers of 1000: ``1_073_741_824`` -> ``'1.07 GB'``."""
    return _scaled(float(n), 1000, _DECIMAL)


def binary_bytes(n: int) -> str:
    """Bytes in powers of 1024: ``1_073_741_824`` -> ``'1 GiB'``."""
    return _scaled(float(n), 1024, _BINARY)


def describe_bytes(n: int) -> str:
    """``'1,073,741,824 B = 1.07 GB = 1 GiB'``."""
    return f"{thousands(n)} B = {decimal_bytes(n)} = {binary_bytes(n)}"


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown precision {dtype!r}; use one of {', '.join(DTYPE_BYTES)}") from None


def _positive(name: str, value: int) -> int:
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1 (got {value})")
    return int(value)


# --- attention maps ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionCost:
    """Memory of the attention probabilities for one forward pass. Entries are probabilities; bytes at ``dtype``."""

    tokens: int  # N (queries = keys)
    heads: int  # H
    layers: int  # L
    batch: int  # B
    dtype: str

    @property
    def bytes_per_entry(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def entries_per_map(self) -> int:
        """One head of one layer: N²."""
        return self.tokens * self.tokens

    @property
    def bytes_per_map(self) -> int:
        return self.entries_per_map * self.bytes_per_entry

    @property
    def entries_per_layer(self) -> int:
        return self.batch * self.heads * self.entries_per_map

    @property
    def bytes_per_layer(self) -> int:
        return self.entries_per_layer * self.bytes_per_entry

    @property
    def entries_all(self) -> int:
        """Every map of the model: B · L · H · N²."""
        return self.layers * self.entries_per_layer

    @property
    def bytes_all(self) -> int:
        return self.entries_all * self.bytes_per_entry

    @property
    def flash_bytes_per_layer(self) -> int:
        """FlashAttention's stand-in for the maps: one float32 logsumexp per query row and head, B · H · N · 4."""
        return self.batch * self.heads * self.tokens * FLASH_STATISTIC_BYTES

    @property
    def flash_bytes_all(self) -> int:
        return self.layers * self.flash_bytes_per_layer

    @property
    def flash_saving(self) -> float:
        """How many times less memory than materialising the maps (= N · bytes per entry / 4)."""
        return self.bytes_all / self.flash_bytes_all


def attention_cost(tokens: int, heads: int = 1, layers: int = 1, dtype: str = "float32",
                   batch: int = 1) -> AttentionCost:
    """Validated ``AttentionCost`` (raises ValueError with the fix for a bad number)."""
    dtype_bytes(dtype)
    return AttentionCost(_positive("tokens N", tokens), _positive("heads H", heads), _positive("layers L", layers),
                         _positive("batch B", batch), dtype)


@dataclass(frozen=True)
class Metric:
    """One number of the calculator as a slide shows it: a label, the value, and what it equals."""

    label: str
    value: str
    detail: str


def calculator_metrics(cost: AttentionCost) -> list[Metric]:
    """One map (N²), all maps (B·L·H·N²) and FlashAttention's O(N) statistics, with separators and both units."""
    return [Metric("Entries per map (N²)", thousands(cost.entries_per_map), describe_bytes(cost.bytes_per_map)),
            Metric("All maps (B·L·H·N²)", binary_bytes(cost.bytes_all),
                   f"{thousands(cost.entries_all)} entries = {decimal_bytes(cost.bytes_all)}"),
            Metric("FlashAttention, O(N)", binary_bytes(cost.flash_bytes_all),
                   f"{ratio_text(cost.bytes_all, cost.flash_bytes_all)} less")]


MEMORY_CURVE_TOKENS = tuple(int(n) for n in np.unique(np.logspace(1, 6, 60).astype(int)))  # 10 … 10⁶, log-spaced


def memory_curve(heads: int = 12, layers: int = 12, dtype: str = "float32", batch: int = 1,
                 tokens: tuple[int, ...] = MEMORY_CURVE_TOKENS) -> dict[str, list[int]]:
    """Bytes of every attention map (B·L·H·N²·b) and of FlashAttention's statistics (B·L·H·N·4) for each N in
    ``tokens``: ``{"tokens", "attention_map_bytes", "flash_bytes"}``, one entry per N."""
    costs = [attention_cost(int(n), heads, layers, dtype, batch) for n in tokens]
    return {"tokens": [c.tokens for c in costs], "attention_map_bytes": [c.bytes_all for c in costs],
            "flash_bytes": [c.flash_bytes_all for c in costs]}


def vit_tokens(image_size: int, patch_size: int, prefix_tokens: int = 1) -> int:
    """(image / patch)² patch tokens plus the prefix ([CLS]): 224 / 16 -> 14² + 1 = 197."""
    if image_size % patch_size:
        raise ValueError(f"the image side {image_size} is not a multiple of the patch size {patch_size}")
    return (image_size // patch_size) ** 2 + prefix_tokens


def lecture_vit_note() -> str:
    """The calculator's default N = 197 beside the lecture's count, so the slide and the page agree."""
    patches, with_cls = (attention_cost(vit_tokens(224, 16, prefix), dtype="float32") for prefix in (0, 1))
    return (f"ViT-B/16 at 224 px: the lecture counts the {patches.tokens} patches only — 14⁴ = "
            f"{patches.entries_per_map:,} entries per map, {binary_bytes(patches.bytes_per_map)} in float32; the model "
            f"also attends to and from [CLS], so N = {with_cls.tokens} and a map has {with_cls.entries_per_map:,} "
            f"entries ({binary_bytes(with_cls.bytes_per_map)}), the calculator's default.")


def windowed_entries(rows: int, cols: int, window: int) -> int:
    """Entries of one head's window attention on a rows×cols token grid with M×M windows: (rows·cols / M²) · M⁴
    = N · M², linear in N (Swin, Liu et al. 2021)."""
    if rows % window or cols % window:
        raise ValueError(f"the window {window} must divide both sides of the {rows}×{cols} grid")
    windows = (rows // window) * (cols // window)
    return windows * (window * window) ** 2


@dataclass(frozen=True)
class ExampleRow:
    label: str
    entries: int | None
    bytes: int | None


@dataclass(frozen=True)
class WorkedExample:
    title: str
    setup: str  # what is being counted, with the numbers that go in
    latex: str
    rows: tuple[ExampleRow, ...]
    takeaway: str


def worked_examples() -> list[WorkedExample]:
    """The lecture's examples, each number computed by the functions above."""
    examples = []

    vit = attention_cost(vit_tokens(224, 16), heads=16, layers=48, dtype="float32")
    patches = attention_cost(vit_tokens(224, 16, prefix_tokens=0), dtype="float32")  # the lecture's count: 14⁴
    grid_16 = attention_cost(vit_tokens(256, 16, prefix_tokens=0), dtype="float32")  # 16 × 16 = 256 patches
    examples.append(WorkedExample(
        "ViT-B/16 on a 224×224 image",
        f"(224 / 16)² = 14² = {patches.tokens} patches (the lecture counts these: 14⁴) + [CLS] = {vit.tokens} tokens "
        "(what the model computes); float32; all maps of a 48-layer, 16-head model",
        rf"N = {patches.tokens}:\ N^2 = 14^4 = {tex_thousands(patches.entries_per_map)}\qquad "
        rf"N = {vit.tokens}\ (\text{{with [CLS]}}):\ N^2 = {tex_thousands(vit.entries_per_map)}",
        (ExampleRow(f"one map over the {patches.tokens} patches only (the lecture's 14⁴)", patches.entries_per_map,
                    patches.bytes_per_map),
         ExampleRow(f"one map over {grid_16.tokens} patches (a 16 × 16 grid)", grid_16.entries_per_map,
                    grid_16.bytes_per_map),
         ExampleRow(f"one map with [CLS] ({vit.tokens} tokens, one head, one layer)", vit.entries_per_map,
                    vit.bytes_per_map),
         ExampleRow("all maps, 48 layers × 16 heads", vit.entries_all, vit.bytes_all),
         ExampleRow("FlashAttention instead (logsumexp per row)", None, vit.flash_bytes_all)),
        "Small enough to keep every map — which is why ViT attention is easy to visualise."))

    pixels = attention_cost(128 * 128, heads=16, layers=48, dtype="float32")
    examples.append(WorkedExample(
        "Pixels as tokens, 128×128 image",
        f"128 × 128 = {pixels.tokens:,} tokens; float32; same depth and heads (48 layers × 16 heads)",
        rf"N = {tex_thousands(pixels.tokens)},\quad N^2 = {tex_thousands(pixels.entries_per_map)}",
        (ExampleRow("one map (one head, one layer)", pixels.entries_per_map, pixels.bytes_per_map),
         ExampleRow("all maps, 48 layers × 16 heads", pixels.entries_all, pixels.bytes_all),
         ExampleRow("FlashAttention instead (logsumexp per row)", None, pixels.flash_bytes_all)),
        "A small image is already 1 GiB per map: why ViT uses 16×16 patches instead of pixels."))

    rows = cols = 56
    window = 7
    full = attention_cost(rows * cols, dtype="float32")
    local = windowed_entries(rows, cols, window)
    examples.append(WorkedExample(
        "Swin, first stage: full vs windowed",
        f"56 × 56 = {full.tokens:,} tokens, windows of M = {window} ({(rows // window) * (cols // window)} windows of "
        f"{window * window} tokens); one head, float32",
        rf"N^2 = {tex_thousands(full.entries_per_map)}\quad\text{{vs}}\quad N M^2 = {tex_thousands(local)}",
        (ExampleRow("full attention, one map", full.entries_per_map, full.bytes_per_map),
         ExampleRow(f"windowed (M = {window}), one map", local, local * full.bytes_per_entry)),
        f"Windows cut the cost by N / M² = {full.entries_per_map // local}× and make it linear in the image area."))

    long = attention_cost(100_000, heads=64, layers=1, dtype="float16")
    examples.append(WorkedExample(
        "A 100K-token sequence, 64 heads, fp16",
        f"N = {long.tokens:,} tokens, 64 heads, float16 (2 bytes), one layer",
        rf"N^2 = {tex_thousands(long.entries_per_map)} = 10^{{10}}",
        (ExampleRow("one map (one head)", long.entries_per_map, long.bytes_per_map),
         ExampleRow("one layer, 64 heads", long.entries_per_layer, long.bytes_per_layer),
         ExampleRow("FlashAttention instead, one layer", None, long.flash_bytes_per_layer)),
        "No GPU holds one layer's maps; FlashAttention needs megabytes instead — long context is only possible "
        "without materialising attention."))
    return examples


# --- KV cache ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KVCacheSpec:
    """What one model keeps per token while it generates."""

    name: str
    kind: str  # "MHA", "GQA", "MQA", "MLA"
    layers: int
    heads: int  # query heads
    kv_heads: int  # key/value heads (MLA: heads, for reference only — the cache holds the latent)
    head_dim: int
    latent_dim: int = 0  # MLA: d_c (kv_lora_rank)
    rope_dim: int = 0  # MLA: d_h^R (qk_rope_head_dim), the decoupled RoPE key shared by all heads
    uncompressed_elements: int = 0  # MLA: per layer, what caching full K (nope + rope) and V per head would take
    source: str = ""  # where the numbers come from, shown beside them
    note: str = ""

    @property
    def elements_per_token_per_layer(self) -> int:
        if self.kind == "MLA":
            return self.latent_dim + self.rope_dim
        return 2 * self.kv_heads * self.head_dim  # a key and a value per KV head

    def bytes_per_token(self, dtype: str = "float16") -> int:
        """All layers, one token: 2 · L · H_kv · d_head · b (MLA: L · (d_c + d_h^R) · b)."""
        return self.layers * self.elements_per_token_per_layer * dtype_bytes(dtype)

    def bytes_per_sequence(self, tokens: int, dtype: str = "float16", batch: int = 1) -> int:
        return _positive("batch", batch) * _positive("sequence length", tokens) * self.bytes_per_token(dtype)

    @property
    def formula(self) -> str:
        """The per-token, per-layer count as LaTeX with this model's numbers."""
        if self.kind == "MLA":
            return rf"d_c + d_h^R = {self.latent_dim} + {self.rope_dim} = {self.elements_per_token_per_layer}"
        return (rf"2 \cdot H_{{kv}} \cdot d_{{head}} = 2 \cdot {self.kv_heads} \cdot {self.head_dim} = "
                rf"{tex_thousands(self.elements_per_token_per_layer)}")


def _first(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def kv_cache_spec(config: Any, name: str, source: str = "", note: str = "") -> KVCacheSpec:
    """Read a transformers config (decoder-only, encoder-decoder, BERT, Falcon, T5, DeepSeek MLA) into a spec."""
    layers = _first(config, "num_decoder_layers", "decoder_layers", "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(config, "decoder_attention_heads", "num_attention_heads", "num_heads", "n_head")
    hidden = _first(config, "d_model", "hidden_size", "n_embd")
    if not layers or not heads:
        raise ValueError(f"the config of {name} does not say how many layers and heads it has")
    if _first(config, "kv_lora_rank"):
        nope = _first(config, "qk_nope_head_dim") or 0
        rope = _first(config, "qk_rope_head_dim") or 0
        v_dim = _first(config, "v_head_dim") or nope
        return KVCacheSpec(name, "MLA", int(layers), int(heads), int(heads), int(nope + rope),
                           latent_dim=int(config.kv_lora_rank), rope_dim=int(rope),
                           uncompressed_elements=int(heads) * int(nope + rope + v_dim), source=source, note=note)
    head_dim = _first(config, "head_dim", "d_kv") or (int(hidden) // int(heads) if hidden else None)
    if not head_dim:
        raise ValueError(f"the config of {name} does not give the head width")
    if getattr(config, "new_decoder_architecture", False):  # Falcon-40B style grouped KV
        kv_heads = _first(config, "num_kv_heads") or heads
    elif getattr(config, "multi_query", False):  # Falcon-7B
        kv_heads = 1
    else:
        kv_heads = _first(config, "num_key_value_heads") or heads
    kv_heads = int(kv_heads)
    kind = "MHA" if kv_heads == heads else "MQA" if kv_heads == 1 else "GQA"
    return KVCacheSpec(name, kind, int(layers), int(heads), kv_heads, int(head_dim), source=source, note=note)


PUBLISHED_NOTE = "published hyper-parameters; config object constructed here, no weights loaded"


def published_kv_specs() -> list[KVCacheSpec]:
    """Well-known models, from their published hyper-parameters (transformers config objects built here)."""
    import transformers

    configs = [
        ("GPT-2 small (MHA)", transformers.GPT2Config(n_layer=12, n_head=12, n_embd=768)),
        ("Llama-2-7B (MHA)", transformers.LlamaConfig(hidden_size=4096, num_hidden_layers=32,
                                                      num_attention_heads=32, num_key_value_heads=32)),
        ("Llama-3-8B (GQA)", transformers.LlamaConfig(hidden_size=4096, num_hidden_layers=32,
                                                      num_attention_heads=32, num_key_value_heads=8)),
        ("Falcon-7B (MQA)", transformers.FalconConfig(hidden_size=4544, num_hidden_layers=32,
                                                      num_attention_heads=71, multi_query=True)),
        ("DeepSeek-V2 (MLA)", transformers.DeepseekV2Config(
            hidden_size=5120, num_hidden_layers=60, num_attention_heads=128, num_key_value_heads=128,
            q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)),
    ]
    return [kv_cache_spec(config, name, PUBLISHED_NOTE) for name, config in configs]


@dataclass
class PresetReport:
    specs: list[KVCacheSpec] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "model: why" for app models whose config could not be read


_GENERATIVE = ("causal_lm", "translation", "moe", "encoder")  # vision families keep no KV cache


def app_model_kv_specs() -> PresetReport:
    """KV-cache specs read from the configs of the models the app loads: packaged (offline), project-trained minis
    with a transformers config, and hub models only when they are already in the local Hugging Face cache."""
    import transformers

    from models import families
    from models.core import loading
    report = PresetReport()
    for family in _GENERATIVE:
        for spec in families.specs(family):
            if spec.library != "transformers":
                continue
            try:
                config, where = _read_config(spec, transformers, loading)
            except (OSError, ValueError, KeyError, TypeError) as error:
                if spec.source != "hub":  # hub models that are not cached are expected to be missing
                    report.skipped.append(f"{spec.key}: {str(error).splitlines()[0][:160]}")
                continue
            note = "encoder: keeps no KV cache in use; shown as if it generated" if family == "encoder" else ""
            window = getattr(config, "sliding_window", None)
            if isinstance(window, int) and window > 0:  # Gemma 3: local layers cache only their window
                note = (f"its sliding-window (local) layers keep at most {window:,} tokens each: every layer is "
                        "counted at full length here, an upper bound")
            try:
                report.specs.append(kv_cache_spec(config, spec.key, where, note))
            except ValueError as error:
                report.skipped.append(f"{spec.key}: {error}")
    return report


def _first_chunk(module: str) -> list:
    """A GGUF split over packages ``<module>_part1``, ``_part2``, … (Gemma 3 270M): its header is at the start of
    the first part's ``*.gguf.part00`` (nothing joined); [] when there is no such package."""
    import importlib.util
    from pathlib import Path

    found = importlib.util.find_spec(f"{module}_part1")
    if found is None or not found.submodule_search_locations:
        return []
    return sorted(Path(list(found.submodule_search_locations)[0]).glob("**/*.gguf.part00"))


def _read_config(spec, transformers, loading):
    if spec.source == "package":
        folder = loading.package_folder(spec.id)
        ggufs = sorted(folder.glob("*.gguf")) or _first_chunk(spec.id)
        if ggufs:  # the hyper-parameters at the front of the header; no tensors, no tokenizer, no dequantising
            return gguf_attention_config(ggufs[0]), f"header of the packaged {ggufs[0].name}"
        for candidate in (folder / "model", folder):
            if (candidate / "config.json").is_file():
                config = transformers.AutoConfig.from_pretrained(str(candidate), local_files_only=True)
                return config, f"config.json of the {spec.id.replace('_', '-')} package"
        raise ValueError("no config in the package")
    if spec.source == "mini":
        folder = loading.SAMPLE_DATA / spec.id
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        return config, f"sample_data/{spec.id}/config.json (trained here)"
    if spec.source == "hub":
        config = transformers.AutoConfig.from_pretrained(spec.id, local_files_only=True, trust_remote_code=False)
        return config, "config from the local Hugging Face cache"
    raise ValueError(f"source {spec.source} is not read for presets")


def custom_kv_spec(kind: str, layers: int, heads: int, head_dim: int, kv_heads: int = 0, latent_dim: int = 0,
                   rope_dim: int = 0) -> KVCacheSpec:
    """A spec from numbers a user typed; ``kv_heads`` is used for GQA, ``latent_dim``/``rope_dim`` for MLA."""
    layers, heads, head_dim = (_positive(n, v) for n, v in (("layers", layers), ("heads", heads),
                                                           ("head width", head_dim)))
    if kind == "MHA":
        kv_heads = heads
    elif kind == "MQA":
        kv_heads = 1
    elif kind == "GQA":
        kv_heads = _positive("key/value heads", kv_heads)
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads cannot be split evenly over {kv_heads} key/value heads; "
                             f"pick a divisor of {heads}")
    elif kind == "MLA":
        _positive("latent width d_c", latent_dim)
        return KVCacheSpec("custom", "MLA", layers, heads, heads, head_dim, latent_dim, int(rope_dim),
                           uncompressed_elements=2 * heads * head_dim, source="typed in")
    else:
        raise ValueError(f"unknown attention kind {kind!r}; use MHA, GQA, MQA or MLA")
    return KVCacheSpec("custom", kind, layers, heads, kv_heads, head_dim, source="typed in")


def ratio_text(a: int, b: int) -> str:
    """``a / b`` for a slide: '64×'."""
    value = a / b
    return f"{value:,.0f}×" if value >= 10 or math.isclose(value, round(value)) else f"{value:,.2f}×"


def example_table(example: WorkedExample) -> list[dict[str, str]]:
    """Rows of a worked example for a table: entries and bytes with separators, decimal and binary units."""
    return [{"what": row.label,
             "entries": thousands(row.entries) if row.entries is not None else "—",
             "bytes": thousands(row.bytes) if row.bytes is not None else "—",
             "decimal": decimal_bytes(row.bytes) if row.bytes is not None else "—",
             "binary": binary_bytes(row.bytes) if row.bytes is not None else "—"} for row in example.rows]


def kv_table(specs: list[KVCacheSpec], tokens: int, dtype: str = "float16") -> list[dict[str, str]]:
    """One row per model: its attention kind, heads, what one token and one ``tokens``-long sequence cost."""
    rows = []
    for spec in specs:
        per_token = spec.bytes_per_token(dtype)
        per_sequence = spec.bytes_per_sequence(tokens, dtype)
        heads = f"{spec.heads} q / latent {spec.latent_dim} + rope {spec.rope_dim}" if spec.kind == "MLA" else \
            f"{spec.heads} q / {spec.kv_heads} kv"
        rows.append({"model": spec.name, "kind": spec.kind, "layers": str(spec.layers), "heads": heads,
                     "head width": str(spec.head_dim),
                     "per token": f"{thousands(per_token)} B = {binary_bytes(per_token)}",
                     f"per {tokens:,}-token sequence": f"{decimal_bytes(per_sequence)} = {binary_bytes(per_sequence)}",
                     "numbers from": spec.source + (f" ({spec.note})" if spec.note else "")})
    return rows


def worked_examples_table(examples: list[WorkedExample]) -> list[dict[str, str]]:
    """Every worked example's rows in one table, each row naming its example (``example_table`` otherwise)."""
    return [{"example": example.title, **row} for example in examples for row in example_table(example)]


@dataclass(frozen=True)
class KVPresets:
    """The KV-cache comparison's models: the app's own (read from their configs), then published ones."""

    specs: tuple[KVCacheSpec, ...]
    skipped: tuple[str, ...]  # "model: why" for app models whose config could not be read


def kv_cache_presets(loaded=None, result=None, options=None) -> KVPresets:
    """The app's models' KV-cache specs and the published ones, as an analysis (no model or run needed): reading
    the configs takes seconds, so the app caches this once and the CLI reads it per call."""
    report = app_model_kv_specs()
    return KVPresets(tuple(report.specs) + tuple(published_kv_specs()), tuple(report.skipped))


def mla_notes(specs: tuple[KVCacheSpec, ...] | list[KVCacheSpec]) -> list[str]:
    """For each MLA model: how many numbers full K and V would take per token and layer, and how many it caches."""
    return [f"{spec.name}: caching full K and V for its {spec.heads} heads would take {spec.uncompressed_elements:,} "
            f"numbers per token and layer; MLA caches {spec.elements_per_token_per_layer:,} "
            f"({ratio_text(spec.uncompressed_elements, spec.elements_per_token_per_layer)} fewer)."
            for spec in specs if spec.kind == "MLA"]
