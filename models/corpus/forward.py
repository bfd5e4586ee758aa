"""One forward pass over a padded batch of documents, each self-attention layer's q and k handed to reductions that
run where the model runs: the one ``record()`` of corpus mode (statistics, the A→B search and the query–key
embedding all read their layers here).

For one layer of one batch, ``LayerCall`` holds q ``(B, H, q, d)`` and k ``(B, H_kv, k, d)`` as the model made
them (post-RoPE, its dtype, its device), the scaling and the mask exactly as SDPA applies it, T5's position bias
included. The weights softmax(q kᵀ·s + mask + bias) are computed once per layer, in float32 on the model's device,
on the first reduction's request, and every reduction of the call shares them; nothing of q, k or the weights
outlives the call. A reduction keeps per layer only what it needs, on the device, and copies it to the host once
per batch (``Reduction.finish``).

Batches: documents sorted longest first and padded on the right (a document's positions are 0..n−1 as when it is
alone), grouped so that the padding stays within ``max_padding`` of the documents' own tokens. On a CPU a batch of
8 runs at the per-token speed of one document, so padding is pure loss and groups stay small; on a GPU the groups
are as large as its free memory allows (``BatchLimits.for_device``).
"""
from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import dataclass, field

import torch

from models.core import capture, text
from models.corpus.readers import Document

MAX_BATCH_DOCUMENTS = 8
MAX_BATCH_TOKENS = 2048  # padded tokens per forward on a CPU: bounds one layer's weights at heads × 2,048 × length
# padding a batch may add, as a share of its documents' own tokens. The forward costs the same per token whether a
# token is real or padding, and on a CPU a batch of 8 runs at the per-token speed of one document alone: 24 python-docs
# paragraphs in groups of 8 padded 1,858 tokens to 2,592 (+40%). Documents sorted by length keep the groups full
# where lengths are dense (a large corpus, where a GPU's batching pays).
MAX_PADDING = 0.1
# a CPU computes a layer's weights in tiles of about this many query rows, each over the keys its rows can see:
# a causal model's tiles skip most of the square's upper half (2 tiles of 182 rows: 75% of it), for ~25 more small
# operations per tile
CPU_TILE_ROWS = 128
# a GPU: how much of its free memory one batch's forward and weights may take, and the most documents per batch
GPU_MEMORY_SHARE = 0.5
GPU_MAX_DOCUMENTS = 512


@dataclass(frozen=True)
class BatchLimits:
    """How documents are grouped into one forward: at most ``documents`` of them, ``tokens`` padded tokens, and
    padding within ``padding`` of their own tokens."""

    documents: int = MAX_BATCH_DOCUMENTS
    tokens: int = MAX_BATCH_TOKENS
    padding: float = MAX_PADDING
    tile_rows: int | None = CPU_TILE_ROWS  # query rows per tile of a layer's weights (None: all rows at once)

    @classmethod
    def for_device(cls, model, device: str, max_tokens: int, padding: float = MAX_PADDING) -> BatchLimits:
        """CPU: small groups (``MAX_BATCH_DOCUMENTS``). CUDA: padded tokens sized to ``GPU_MEMORY_SHARE`` of the
        free memory, at ``bytes_per_token`` each (the forward's activations of one layer plus this layer's float32
        scores and weights, whose rows are ``max_tokens`` long)."""
        if not str(device).startswith("cuda") or not torch.cuda.is_available():
            return cls(padding=padding)
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        tokens = int(GPU_MEMORY_SHARE * free / bytes_per_token(model, max_tokens))
        tokens = max(max_tokens, min(tokens, GPU_MAX_DOCUMENTS * max_tokens))
        return cls(GPU_MAX_DOCUMENTS, tokens, padding, tile_rows=None)  # one tile: fewer, larger kernels


def bytes_per_token(model, width: int) -> int:
    """Device bytes one padded token of a batch of documents ``width`` tokens long costs at the peak of a layer:
    its hidden states and MLP activations in the model's dtype, and its rows of the layer's scores, weights and one
    temporary in float32 (``heads × width × 4`` bytes each)."""
    config = getattr(model.config, "text_config", model.config)
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 1024)
    inner = int(getattr(config, "intermediate_size", 0) or getattr(config, "n_inner", 0) or 4 * hidden)
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0) or 16)
    itemsize = next(model.parameters()).element_size()
    return (8 * hidden + 3 * inner) * itemsize + 3 * heads * width * 4


def batches(documents: list[tuple[Document, list[int]]], max_documents: int = MAX_BATCH_DOCUMENTS,
            max_tokens: int = MAX_BATCH_TOKENS, max_padding: float = MAX_PADDING,
            ) -> list[list[tuple[Document, list[int]]]]:
    """Consecutive documents grouped so that documents × longest ≤ ``max_tokens`` and the padding stays within
    ``max_padding`` of the group's own tokens (order kept)."""
    groups, current, longest, real = [], [], 0, 0
    for item in documents:
        length = len(item[1])
        longer = max(longest, length)
        padded = longer * (len(current) + 1)
        if current and (len(current) >= max_documents or padded > max_tokens
                        or padded > (1 + max_padding) * (real + length)):
            groups.append(current)
            current, longer, real = [], length, 0
        current.append(item)
        longest, real = longer, real + length
    if current:
        groups.append(current)
    return groups


@dataclass(frozen=True)
class Batch:
    """Documents right-padded to one width, on the model's device."""

    documents: list[Document]
    token_ids: list[list[int]]
    ids: torch.Tensor  # (B, S) long
    attention_mask: torch.Tensor  # (B, S) long: 1 on a document's tokens
    lengths: torch.Tensor  # (B,) long

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def valid(self) -> torch.Tensor:
        """(B, S) bool: the documents' own tokens, not the padding."""
        return self.attention_mask.bool()


@dataclass
class Mask:
    """One batch's mask as SDPA applies it, on the model's device (shared by every layer that gets the same one),
    and the tiles its weights are computed in."""

    allowed: torch.Tensor  # bool (B or 1, q, k): True = the key is visible
    additive: torch.Tensor  # float32 (B or 1, 1, q, k): 0 where visible, float32's min where not, plus a float
    # mask's own bias
    empty_rows: torch.Tensor | None  # bool (B or 1, q) of queries that see no key (their weights are 0), or None
    tiles: list[tuple[int, int, int]]  # (first row, end row, end key): rows r0..r1−1 see no key at or past the end


def tile_plan(allowed: torch.Tensor, tile_rows: int | None) -> list[tuple[int, int, int]]:
    """Query rows in about equal tiles of at most ``tile_rows`` (None: one tile), each with the keys up to the last
    one any of its rows sees (and at least up to its own diagonal). A causal mask's tiles skip the keys after them:
    three tiles of a 136-token batch compute 67% of the square; an encoder's tiles all read every key, so it gets
    one."""
    q_len, k_len = allowed.shape[-2:]
    count = 1 if tile_rows is None else math.ceil(q_len / tile_rows)
    if count <= 1:
        return [(0, q_len, k_len)]
    bounds = [round(i * q_len / count) for i in range(count + 1)]
    seen = allowed.any(0)  # (q, k): a key some document's query of this row sees
    last = torch.where(seen, torch.arange(k_len, device=seen.device), -1).amax(-1).tolist()  # (q,) last key seen
    tiles = []
    for start, end in itertools.pairwise(bounds):
        keys = max(max(last[start:end]) + 1, min(end, k_len))
        tiles.append((start, end, keys))
    if all(keys == k_len for _, _, keys in tiles):
        return [(0, q_len, k_len)]
    return tiles


def _mask(module, attention_mask, kwargs, q_len: int, k_len: int, device, tile_rows: int | None) -> Mask:
    """``capture.Recorder._mask``'s reading of the mask (bool, additive float, or SDPA's implicit causal one), kept
    on the model's device."""
    bias = None
    if attention_mask is None:
        is_causal = kwargs.get("is_causal")
        is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        allowed = torch.ones(1, q_len, k_len, dtype=torch.bool, device=device)
        if q_len > 1 and is_causal:  # SDPA's is_causal aligns top-left
            allowed = allowed.tril()
    else:
        mask = attention_mask.detach()[..., -k_len:]
        if mask.dtype == torch.bool:
            allowed = mask[:, 0] if mask.ndim == 4 else mask
        else:  # additive float mask: very negative = blocked, anything else a bias SDPA adds
            blocked = mask <= torch.finfo(mask.dtype).min / 2
            allowed = ~(blocked[:, 0] if blocked.ndim == 4 else blocked)
            bias = torch.where(blocked, torch.zeros((), dtype=mask.dtype, device=mask.device), mask).float()
            bias = bias if bias.ndim == 4 else bias[:, None]  # (B or 1, H or 1, q, k)
    allowed = allowed.to(device)
    additive = torch.zeros(allowed.shape[0], 1, q_len, k_len, dtype=torch.float32, device=device)
    additive.masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
    if bias is not None and bool(bias.abs().amax() > 0):
        additive = additive + bias.to(device)
    empty = ~allowed.any(-1)
    return Mask(allowed, additive, empty if bool(empty.any()) else None, tile_plan(allowed, tile_rows))


@dataclass(frozen=True)
class Tile:
    """The weights of query rows ``start``..``end``−1 over keys 0..``keys``−1 (the rows see no key after those)."""

    start: int
    end: int
    keys: int
    weights: torch.Tensor  # float32 (B, H, rows, keys)
    weighted_shift: torch.Tensor  # float32 (B, H, rows): Σ_k w·(s_k − max_k s)


@dataclass
class LayerCall:
    """One self-attention call of one batch; ``tiles()`` computes softmax(q kᵀ·s + mask + bias) once."""

    index: int  # the layer's position among the model's self-attention calls
    query: torch.Tensor  # (B, H, q, d), the model's dtype and device
    key: torch.Tensor  # (B, H_kv, k, d)
    scaling: float
    mask: Mask
    position_bias: torch.Tensor | None  # float32 (B or 1, H or 1, q, k) (T5's relative bias) or None
    value: torch.Tensor | None = None  # (B, H_kv, k, d): given, ``tiles()`` also makes the call's ``output``
    output: torch.Tensor | None = None  # (B, q, H, d) in v's dtype: softmax(...) v from the same weights
    _tiles: list[Tile] | None = None

    @property
    def group(self) -> int:
        """Query heads per key head (GQA): head ``h`` reads key head ``h // group``."""
        return self.query.shape[1] // self.key.shape[1]

    def tiles(self) -> list[Tile]:
        """The attention weights, float32 (float64 for a float64 model) on the model's device, in tiles of query
        rows (``Mask.tiles``); rows of a query that sees no key are 0. With each tile, per query Σ_k w·(s_k − max_k s): with the largest weight
        w_max = 1 / Σ_k exp(s_k − max s), a row's entropy is −Σ w·(s − max) − log w_max, no logarithm of every
        weight (``statistics``). Computed on the first call, then shared: a reduction that writes into the
        weights puts them back before it returns."""
        if self._tiles is None:
            query, key = self.query, self.key
            batch, heads, q_len, dim = query.shape
            kv_heads = key.shape[1]
            group = heads // kv_heads
            # the scaling folded into q (B·H·q·d values, not B·H·q·k); the query heads that share a key head are
            # one taller matrix: one GEMM per key head, no repeated keys
            half = half_precision_products(query)
            dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
            if half:  # q and k as they are; the scaling after the product (it would round a half-precision q)
                grouped, keys_t = query.view(batch, kv_heads, group, q_len, dim), key.transpose(-1, -2)
            else:
                grouped = (query.to(dtype) * self.scaling).view(batch, kv_heads, group, q_len, dim)
                keys_t = key.to(dtype).transpose(-1, -2)  # (B, H_kv, d, k)
            self._tiles = []
            for start, end, keys in self.mask.tiles:
                rows = end - start
                tall = grouped[:, :, :, start:end].reshape(batch * kv_heads, group * rows, dim)
                if half:
                    scores = torch.bmm(tall, keys_t[..., :keys].reshape(batch * kv_heads, dim, keys),
                                       out_dtype=torch.float32).mul_(self.scaling)
                else:
                    scores = torch.matmul(tall.view(batch, kv_heads, group * rows, dim), keys_t[..., :keys])
                scores = scores.view(batch, heads, rows, keys)
                scores.add_(self.mask.additive[:, :, start:end, :keys])
                if self.position_bias is not None:
                    scores.add_(self.position_bias[..., start:end, :keys])
                scores.sub_(scores.amax(-1, keepdim=True))  # ≤ 0; blocked keys hugely negative but finite
                weights = torch.softmax(scores, dim=-1)
                if self.mask.empty_rows is not None:
                    weights.masked_fill_(self.mask.empty_rows[:, None, start:end, None], 0.0)
                weighted_shift = scores.mul_(weights).sum(-1)  # blocked keys: 0 × finite = 0
                self._tiles.append(Tile(start, end, keys, weights, weighted_shift))
            if self.value is not None:
                self.output = self._output(self._tiles)
        return self._tiles

    def _output(self, tiles: list[Tile]) -> torch.Tensor:
        """The layer's attention output ``(B, q, H, d)`` from these weights (before any reduction writes into
        them): per tile, the rows' weights times the values of the keys they see, the query heads that share a key
        head as one taller matrix (no repeated values, as ``tiles`` does for the keys)."""
        value = self.value
        batch, heads, q_len = self.query.shape[:3]
        kv_heads, dim = value.shape[1], value.shape[-1]
        values = value.to(tiles[0].weights.dtype)
        output = torch.empty(batch, q_len, heads, dim, dtype=value.dtype, device=value.device)
        for tile in tiles:
            rows = tile.end - tile.start
            tall = tile.weights.view(batch, kv_heads, self.group * rows, tile.keys)
            product = torch.matmul(tall, values[:, :, :tile.keys]).view(batch, heads, rows, dim)
            output[:, tile.start:tile.end] = product.transpose(1, 2)
        return output

    def weights(self) -> torch.Tensor:
        """The whole ``(B, H, q, k)`` weights (the tiles put together; a key a tile skips has weight 0)."""
        tiles = self.tiles()
        if len(tiles) == 1 and tiles[0].keys == self.key.shape[2]:
            return tiles[0].weights
        batch, heads, q_len = self.query.shape[:3]
        whole = torch.zeros(batch, heads, q_len, self.key.shape[2], dtype=tiles[0].weights.dtype,
                            device=self.query.device)
        for tile in tiles:
            whole[:, :, tile.start:tile.end, :tile.keys] = tile.weights
        return whole

    def release(self) -> None:
        self._tiles = self.output = None


_HALF_PRODUCTS: dict[tuple, bool] = {}


def half_precision_products(query: torch.Tensor) -> bool:
    """Whether q kᵀ of a half-precision model can run as a half-precision GEMM with a float32 result (CUDA's
    ``bmm(..., out_dtype=float32)``): a product of two bfloat16 (float16) values is exact in float32 and the sums
    accumulate in float32, so the scores are the float32 GEMM's without converting q and k. A CPU has no such
    kernel in PyTorch: q and k are converted to float32 there."""
    if query.device.type != "cuda" or query.dtype not in (torch.float16, torch.bfloat16):
        return False
    key = (str(query.device), query.dtype)
    if key not in _HALF_PRODUCTS:
        probe = torch.ones(1, 2, 2, dtype=query.dtype, device=query.device)
        try:
            _HALF_PRODUCTS[key] = torch.bmm(probe, probe, out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError):
            _HALF_PRODUCTS[key] = False
    return _HALF_PRODUCTS[key]


class Reduction:
    """Something read from every self-attention layer of a batch, in the forward: ``start`` once per batch,
    ``layer`` once per layer (keep only what is needed, on the device), ``finish`` once per batch (copy to the
    host)."""

    def start(self, batch: Batch) -> None:
        pass

    def layer(self, call: LayerCall) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass


@dataclass
class CorpusRecorder(capture.Recorder):
    """The one ``record()`` of corpus mode: each self-attention call of the model, turned into a ``LayerCall`` and
    handed to every reduction at once (cross-attention is not read)."""

    reductions: list[Reduction] = field(default_factory=list)
    tile_rows: int | None = None  # query rows per tile of weights (None: one tile)
    index: int = 0
    _masks: dict = field(default_factory=dict)

    def attend(self, module, query, key, value, attention_mask, kwargs) -> torch.Tensor | None:
        """On a CPU, a layer whose weights the reductions computed (``LayerCall.tiles``) gets its output from them
        (one more product, over the keys each tile sees) instead of SDPA computing the weights a second time: 0.70 s
        of SDPA (its GQA copies of k and v included) against ~0.1 s for 48 documents of SmolLM2 on 2 cores. Only
        where the weights are in the model's own precision (float32, float64): a half-precision model keeps SDPA's
        rounding of its output. A GPU keeps its fused SDPA kernel (the fused statistics kernel makes no weights)."""
        own = (query.device.type == "cpu" and query.dtype in (torch.float32, torch.float64)
               and not kwargs.get("dropout") and kwargs.get("softcap") is None and kwargs.get("s_aux") is None)
        return self.record(module, query, key, attention_mask, kwargs, value if own else None)

    def record(self, module, query, key, attention_mask, kwargs, value=None) -> torch.Tensor | None:
        """Hand the call to every reduction; with ``value``, return the output its weights give (None when no
        reduction computed weights, or for cross-attention, which is not read)."""
        name = self.module_names.get(id(module), "")
        if self.kind_of(module, name) == "cross":
            return None
        q_len, k_len = query.shape[2], key.shape[2]
        scaling = kwargs.get("scaling")
        scaling = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        mask_key = ("implicit", q_len, k_len) if attention_mask is None else id(attention_mask)
        if mask_key not in self._masks:  # one mask per batch, shared by the layers that get it
            self._masks[mask_key] = (_mask(module, attention_mask, kwargs, q_len, k_len, query.device,
                                           self.tile_rows),
                                     attention_mask)  # the mask itself kept alive: its id stays its own
        mask = self._masks[mask_key][0]
        position_bias = kwargs.get("position_bias")
        if position_bias is not None:  # T5-style relative bias, which SDPA adds to the scores
            position_bias = position_bias.detach()[..., -k_len:].to(torch.float32)
        call = LayerCall(self.index, query.detach(), key.detach(), scaling, mask, position_bias,
                         None if value is None else value.detach())
        for reduction in self.reductions:
            reduction.layer(call)
        output = call.output
        call.release()
        self.index += 1
        return output


def _accepts(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


class BatchRunner:
    """A loaded model set up to run documents in padded batches through its base (no LM head) with reductions.

    Holds only the model and settings, so a Ray actor builds one per process and the in-process engine one per run.
    """

    def __init__(self, loaded, max_tokens: int = 256, max_padding: float = MAX_PADDING,
                 limits: BatchLimits | None = None):
        model = loaded.model
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError("Corpus statistics read text with one stack of layers (a causal LM, an encoder or a "
                             "decoder-only MoE); encoder–decoder models such as translators are not supported.")
        self.loaded = loaded
        self.max_tokens = max_tokens
        self.limits = limits or BatchLimits.for_device(model, loaded.device, max_tokens, max_padding)
        self.base = getattr(model, "base_model", model) or model  # no LM head: nothing here needs logits
        tokenizer = loaded.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.extra = {"use_cache": False} if _accepts(self.base, "use_cache") else {}
        self.names = {id(m): name for name, m in model.named_modules()}

    def tokenize(self, document: Document) -> list[int]:
        return text.tokenize(self.loaded.tokenizer, document.text, self.max_tokens).ids

    def tokenized(self, documents: list[Document]) -> tuple[list[tuple[Document, list[int]]], list[tuple[str, str]]]:
        """``(document, ids)`` of each document that tokenises, and ``(doc_id, reason)`` of each that does not."""
        done, skipped = [], []
        for document in documents:
            try:
                done.append((document, self.tokenize(document)))
            except ValueError as error:
                skipped.append((document.doc_id, str(error)))
        return done, skipped

    def groups(self, tokenized: list[tuple[Document, list[int]]]) -> list[list[tuple[Document, list[int]]]]:
        """The batches these documents run in: longest first, so that a batch pads to lengths alike (unsorted, 8
        documents of ~70 tokens padded to one of 256 did 3× the work)."""
        limits = self.limits
        return batches(sorted(tokenized, key=lambda item: -len(item[1])), limits.documents, limits.tokens,
                       limits.padding)

    def padded(self, group: list[tuple[Document, list[int]]]) -> Batch:
        lengths = [len(ids) for _, ids in group]
        width = max(lengths)
        ids = torch.full((len(group), width), self.pad_id, dtype=torch.long)
        for row, (_, token_ids) in enumerate(group):
            ids[row, :len(token_ids)] = torch.tensor(token_ids)
        lengths_tensor = torch.tensor(lengths)
        attention_mask = (torch.arange(width)[None, :] < lengths_tensor[:, None]).long()
        device = self.loaded.device
        return Batch([document for document, _ in group], [list(token_ids) for _, token_ids in group],
                     ids.to(device), attention_mask.to(device), lengths_tensor.to(device))

    def forward(self, batch: Batch, reductions: list[Reduction], routing: bool = False):
        """One forward of ``batch`` with every reduction reading each layer; returns the MoE routing recorder
        (``models.families.moe.model.recording``) when ``routing``, else None."""
        recorder = CorpusRecorder(module_names=self.names, reductions=reductions, tile_rows=self.limits.tile_rows)
        for reduction in reductions:
            reduction.start(batch)
        router = None
        with torch.inference_mode(), capture.observing(self.loaded.model, recorder):
            if routing:
                from models.families.moe import model as moe

                with moe.recording(self.loaded.model) as router:
                    self.base(input_ids=batch.ids, attention_mask=batch.attention_mask, **self.extra)
            else:
                self.base(input_ids=batch.ids, attention_mask=batch.attention_mask, **self.extra)
            for reduction in reductions:
                reduction.finish()
        return router

    def forward_only(self, documents: list[Document]) -> None:
        """The same forwards on the same batches with nothing recorded: what any per-document function that runs
        this model must pay at least (the corpus benchmark's ceiling)."""
        for group in self.groups(self.tokenized(documents)[0]):
            batch = self.padded(group)
            with torch.inference_mode():
                self.base(input_ids=batch.ids, attention_mask=batch.attention_mask, **self.extra)
