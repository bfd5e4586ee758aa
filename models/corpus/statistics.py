"""The per-document function of corpus mode: token ids -> per-head statistics, reduced layer by layer in the forward.

For a head's weights A ``(q, k)`` of one document, each statistic is a mean over the document's
queries: the corpus rows of ``models.core.head_statistics.TABLE`` (names, labels, formulas).
The ``peak`` of a head in a document is its largest weight off the first token and off the diagonal, with the
query and key where it sits: the corpus page's "top examples" are the documents with the highest peaks.
For MoE models: per MoE layer the expert load (share of top-k assignments), the co-activation matrix and the mean
router entropy (nats), from ``models.analysis.routing`` on the document's tokens.

How: documents run in padded batches through the model's base (no LM head); ``forward.CorpusRecorder`` hands
each self-attention layer's q and k to ``HeadStatistics``, which reduces the layer's weights (``LayerCall.weights``,
float32 on the model's device) to ``(batch, heads)`` numbers at once and keeps them on the device; one host copy per
batch. Memory stays one layer's weights of one batch. The passes over a layer's ``(B, H, q, k)`` weights are few
and cheap: the entropy needs no logarithm of every weight (−Σ w·(s − max s) − log w_max), the largest weight is the
largest one off the first key and the diagonal or one of those two (read before they are set aside for the peak),
and the induction score reads only its target cells.
``eager_statistics`` is the baseline the benchmark and the tests compare with: ``output_attentions=True`` on an eager
model, one document at a time, numpy on the returned maps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from models.core import head_statistics
from models.corpus.forward import (  # noqa: F401  (batches and the limits: this module's public names too)
    MAX_BATCH_DOCUMENTS,
    MAX_BATCH_TOKENS,
    MAX_PADDING,
    Batch,
    BatchRunner,
    LayerCall,
    Reduction,
    batches,
)
from models.corpus import statistics_triton
from models.corpus.readers import Document

STATISTICS = head_statistics.labels(head_statistics.CORPUS)  # {name: label}, the table's
PEAK_FIELDS = head_statistics.PEAK_FIELDS
FIELDS = (*STATISTICS, *PEAK_FIELDS)  # the last axis of what ``HeadStatistics`` copies to the host


@dataclass
class DocumentStatistics:
    """One document's numbers: ``statistics[name]`` and the peak fields are ``(layers, heads)``."""

    doc_id: str
    token_ids: list[int]
    statistics: dict[str, np.ndarray]
    peak_value: np.ndarray
    peak_query: np.ndarray
    peak_key: np.ndarray
    expert_load: np.ndarray | None = None  # (moe layers, experts)
    coactivation: np.ndarray | None = None  # (moe layers, experts, experts)
    router_entropy: np.ndarray | None = None  # (moe layers,) nats


class HeadStatistics(Reduction):
    """Every statistic of every head of every layer of one batch, reduced in the forward on the model's device, tile
    by tile of query rows (``LayerCall.tiles``). It must be the last reduction of a call: it writes into the
    weights (the first key and the diagonal are set aside for the peak).

    Per layer, few operations over the ``(B, H, q, k)`` weights: their row max (the max weight, and with the tile's
    Σ w·(s − max s) the entropy), one dot with the distances, one gather of the induction target cells, one max
    after the first key and the diagonal are set aside (the peak); the rest is ``(B, H, q)`` and the means over a
    document's real queries are one matrix product. ``values`` after ``finish``: float32 numpy ``(B, layers, heads,
    len(FIELDS))``: one host copy per batch, finished there (bits, divisions, the peak's "none")."""

    values: np.ndarray | None = None

    def __init__(self, layers: int = 1):
        self.capacity = layers  # self-attention layers a batch has: the fused kernel's outputs are made once for all

    def start(self, batch: Batch) -> None:
        ids, valid = batch.ids, batch.valid()  # (B, S)
        width = batch.width
        self.ids, self.lengths = ids, batch.lengths.to(torch.int32)
        self.fused: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (out, peak, peak_key) per layer
        self.fused_count = 0
        self.masks: dict[int, bool | None] = {}  # per mask: causal, padding only, or neither (the PyTorch path)
        self.valid = valid
        self.count = valid.sum(-1)  # (B,) real queries
        self.query_share = valid / self.count[:, None].to(torch.float64)  # (B, S): a mean over real queries
        positions = torch.arange(width, device=ids.device)
        self.distance = (positions[:, None] - positions[None, :]).abs().to(torch.float32)  # (q, k) tokens
        # induction targets: key t (1 <= t < q) whose previous token equals the query's token, both real tokens
        targets = torch.zeros(ids.shape[0], width, width, dtype=torch.bool, device=ids.device)
        targets[:, :, 1:] = ids[:, :, None] == ids[:, None, :-1]
        targets &= torch.ones(width, width, dtype=torch.bool, device=ids.device).tril(-1)
        targets &= valid[:, :, None] & valid[:, None, :]
        self.target_queries = targets.any(-1).sum(-1)  # (B,) 0: no repeats, the score is NaN
        self.target_cells = targets  # listed by ``_plan`` (the PyTorch path) only: a nonzero waits for the device
        self.plans: dict[int, list] = {}
        self.local: dict[tuple, tuple] = {}
        self.layers: list[torch.Tensor] = []

    def _local(self, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(query_share, distance)`` where a layer's weights are (a model spread over GPUs has layers on each)."""
        key = (device, dtype)
        if key not in self.local:
            self.local[key] = (self.query_share.to(device, dtype), self.distance.to(device, dtype))
        return self.local[key]

    def _plan(self, call: LayerCall) -> list:
        """Per tile of this mask: its rows that have no peak (padding, or no key but the first and themselves),
        and its induction target cells (document, row in the tile, key)."""
        key = id(call.mask)
        if key not in self.plans:
            allowed = call.mask.allowed.clone()  # (B or 1, q, k)
            allowed[:, :, 0] = False
            allowed.diagonal(dim1=-2, dim2=-1).fill_(False)
            no_peak = ~(allowed.any(-1) & self.valid)  # (B, q)
            # every target cell, sorted by query: the tiles slice it
            query, document, key_ = self.target_cells.transpose(0, 1).nonzero(as_tuple=True)
            bounds = torch.tensor([tile[0] for tile in call.mask.tiles] + [call.mask.tiles[-1][1]],
                                  device=query.device)
            cuts = torch.searchsorted(query, bounds).tolist()  # the cells of each tile: a slice of the sorted list
            tiles = []
            for (start, end, _), first, last in zip(call.mask.tiles, cuts, cuts[1:]):
                cells = (document[first:last], query[first:last] - start, key_[first:last])
                tiles.append((no_peak[:, None, start:end], cells))
            self.plans[key] = tiles
        return self.plans[key]

    def _causal(self, call: LayerCall) -> bool | None:
        """Whether the fused kernel takes this layer, causal (True) or not (False); None: the PyTorch path."""
        if not statistics_triton.usable(call.query, call.key, call.position_bias):
            return None
        if id(call.mask) not in self.masks:
            self.masks[id(call.mask)] = statistics_triton.described(call.mask.allowed, self.lengths)
        return self.masks[id(call.mask)]

    def _fused_layer(self, call: LayerCall, causal: bool) -> int:
        """One launch: this layer's statistics into the batch's fused outputs; returns its slot there."""
        batch, heads, width = call.query.shape[:3]
        if self.fused is None or self.fused_count == self.fused[0].shape[0]:  # made once a batch (grown if needed)
            size = max(self.capacity, 2 * self.fused_count, 1)
            device = call.query.device
            grown = (torch.zeros(size, batch, heads, statistics_triton.FIELDS, device=device),
                     torch.full((size, batch, heads), -1, dtype=torch.int64, device=device),
                     torch.zeros(size, batch, heads, width, dtype=torch.int32, device=device))
            if self.fused is not None:
                for new, old in zip(grown, self.fused):
                    new[:self.fused_count] = old
            self.fused = grown
        slot = self.fused_count
        out, peak, peak_key = (part[slot] for part in self.fused)
        statistics_triton.layer_statistics(call.query, call.key, call.scaling, causal, self.ids.to(call.query.device),
                                           self.lengths.to(call.query.device), out, peak, peak_key)
        self.fused_count += 1
        return slot

    def layer(self, call: LayerCall) -> None:
        causal = self._causal(call)
        if causal is not None:
            self.layers.append(self._fused_layer(call, causal))  # an int: the layer's slot in the fused outputs
            return
        batch, heads = call.query.shape[:2]
        tiles = call.tiles()
        query_share, distance = self._local(tiles[0].weights.device, tiles[0].weights.dtype)
        per_query, peaks = [], []
        induction = torch.zeros(batch, heads, dtype=query_share.dtype, device=query_share.device)
        for tile, (no_peak, (document, row, key)) in zip(tiles, self._plan(call)):
            weights = tile.weights  # (B, H, rows, keys)
            largest = weights.amax(-1)  # (B, H, rows): the max weight, 1 / Σ exp(s − max s)
            plogp = torch.log(largest).add_(tile.weighted_shift)  # Σ w log w = Σ w·(s − max s) + log w_max
            if call.mask.empty_rows is not None:  # a query that sees nothing: entropy 0, as its weights are 0
                plogp.masked_fill_(call.mask.empty_rows[:, None, tile.start:tile.end], 0.0)
            previous = weights.diagonal(offset=tile.start - 1, dim1=-2, dim2=-1)  # A[i, i−1]
            if tile.start == 0:  # the first query has no previous token
                previous = torch.nn.functional.pad(previous, (1, 0))
            per_query.append(torch.stack([
                plogp, torch.linalg.vecdot(weights, distance[tile.start:tile.end, :tile.keys]),
                weights[..., 0], weights.diagonal(offset=tile.start, dim1=-2, dim2=-1), largest, previous], dim=-1))
            if len(document):
                induction.index_add_(0, document, weights[document, :, row, key])  # (cells, H) per document
            # the peak: the largest weight off the first key and the diagonal (written over: this runs last)
            weights[..., 0] = -1.0
            weights.diagonal(offset=tile.start, dim1=-2, dim2=-1).fill_(-1.0)
            peak, peak_row = weights.amax(-1).masked_fill_(no_peak, -1.0).max(-1)  # (B, H)
            chosen = weights.gather(2, peak_row[:, :, None, None].expand(batch, heads, 1, tile.keys))
            peaks.append(torch.stack([peak, peak_row.add(tile.start).to(peak.dtype),
                                      chosen[:, :, 0].argmax(-1).to(peak.dtype)], dim=-1))  # (B, H, 3)
        per_query = per_query[0] if len(per_query) == 1 else torch.cat(per_query, dim=2)  # (B, H, q, 6)
        means = torch.matmul(query_share[:, None, None, :], per_query)[:, :, 0]  # (B, H, 6)
        if len(peaks) == 1:
            peak = peaks[0]
        else:  # the first tile with the highest peak: the first query, as a flat argmax would pick
            peaks = torch.stack(peaks, dim=2)  # (B, H, tiles, 3)
            best = peaks[..., 0].argmax(-1)
            peak = peaks.gather(2, best[:, :, None, None].expand(batch, heads, 1, 3))[:, :, 0]
        layer = torch.cat([means, induction[..., None], peak], dim=-1)  # (B, H, 10)
        self.layers.append(layer.to(self.valid.device))  # a model spread over GPUs: gathered on the first

    def finish(self) -> None:
        fused = None
        if self.fused is not None:  # (B, fused layers, H, 10), decoded on the device
            fused = statistics_triton.decode(*(part[:self.fused_count] for part in self.fused)).transpose(0, 1)
        if all(isinstance(layer, int) for layer in self.layers) and fused is not None:
            stacked = fused[:, self.layers]
        else:
            stacked = torch.stack([fused[:, layer].to(self.valid.device) if isinstance(layer, int) else layer
                                   for layer in self.layers], dim=1)
        raw = stacked.cpu().numpy()  # (B, layers, H, 10): the one host copy
        self.layers, self.fused = [], None
        count = self.count.cpu().numpy().astype(raw.dtype)[:, None, None]
        previous_count = np.maximum(count - 1, 1)  # queries 1.. of a document
        with np.errstate(invalid="ignore", divide="ignore"):
            induction = raw[..., 6] / self.target_queries.cpu().numpy()[:, None, None]  # 0/0: no repeats, NaN
        found = raw[..., 7] >= 0
        columns = {"entropy_bits": -raw[..., 0] / raw.dtype.type(math.log(2)), "mean_distance": raw[..., 1],
                   "first_token": raw[..., 2], "previous_token": raw[..., 5] * count / previous_count,
                   "diagonal": raw[..., 3], "induction": induction, "max_weight": raw[..., 4],
                   "peak_value": np.where(found, raw[..., 7], np.nan), "peak_query": np.where(found, raw[..., 8], -1),
                   "peak_key": np.where(found, raw[..., 9], -1)}
        self.values = np.stack([columns[name] for name in FIELDS], axis=-1)  # float64 for a float64 model


class StatisticsRunner(BatchRunner):
    """The per-document function bound to one loaded model: ``run(documents) -> (statistics, skipped)``."""

    def __init__(self, loaded, max_tokens: int = 256, max_padding: float = MAX_PADDING, limits=None):
        super().__init__(loaded, max_tokens, max_padding, limits)
        self.is_moe = _is_moe(loaded.model)
        self.layers, self.heads = _shape(loaded.model)

    def run(self, documents: list[Document], also: tuple[Reduction, ...] = ()
            ) -> tuple[list[DocumentStatistics], list[tuple[str, str]]]:
        """Statistics of each document that tokenises, in the documents' order, and ``(doc_id, reason)`` for each
        that does not. ``also``: more reductions that read the same forwards (the A→B search, the query–key
        sample)."""
        tokenized, skipped = self.tokenized(documents)
        done = {}
        for group in self.groups(tokenized):
            done.update((item.doc_id, item) for item in self._run_batch(self.padded(group), list(also)))
        return [done[document.doc_id] for document, _ in tokenized], skipped

    def _run_batch(self, batch: Batch, also: list[Reduction]) -> list[DocumentStatistics]:
        statistics = HeadStatistics(self.layers)
        routing = self.forward(batch, [*also, statistics], routing=self.is_moe)  # statistics last: see there
        values = statistics.values
        lengths = batch.lengths.tolist()
        results = []
        for row, (document, token_ids) in enumerate(zip(batch.documents, batch.token_ids)):
            item = DocumentStatistics(
                document.doc_id, token_ids, {name: values[row, :, :, i] for i, name in enumerate(STATISTICS)},
                values[row, :, :, -3], values[row, :, :, -2].astype(np.int32), values[row, :, :, -1].astype(np.int32))
            if routing is not None:
                _add_routing(item, routing, row, batch.width, lengths[row])
            results.append(item)
        return results


def _add_routing(item: DocumentStatistics, recorder, row: int, width: int, length: int) -> None:
    """Expert load, co-activation and router entropy of one document of the batch (its tokens, not the padding)."""
    from models.analysis import routing as stats
    from models.families.moe import model as moe

    sites = [s for s in recorder.sites if s.name in recorder.calls]
    calls = [recorder.calls[s.name][-1] for s in sites]
    rule = moe.infer_dispatch_rule(calls, recorder.score_functions)
    num_experts = calls[0].logits.shape[-1]
    loads, coactivations, entropies = [], [], []
    for call in calls:
        rows = slice(row * width, row * width + length)
        experts = call.experts[rows].numpy()  # (tokens, k)
        scores = moe.scores_from_logits(call.logits[rows], rule.score_function if rule else "softmax")
        probs = (scores / scores.sum(dim=-1, keepdim=True)).numpy()
        loads.append(stats.expert_load(experts[None], num_experts)[0])
        coactivations.append(stats.coactivation(experts, num_experts))
        entropies.append(stats.router_entropy(probs).mean())
    item.expert_load = np.asarray(loads, np.float32)
    item.coactivation = np.asarray(coactivations, np.float32)
    item.router_entropy = np.asarray(entropies, np.float32)


def _is_moe(model) -> bool:
    from models.families.moe import model as moe

    return moe.is_moe_model(model)


def _shape(model) -> tuple[int, int]:
    config = model.config
    config = getattr(config, "text_config", config)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    return int(layers), int(heads)


# --- the baseline: output_attentions=True on an eager model, numpy on the maps ---------------------------------

def eager_statistics(model, token_ids: list[int]) -> dict[str, np.ndarray]:
    """The same statistics from the maps an eager model returns with ``output_attentions=True``,
    one document: ``head_statistics.reference`` of each layer, ``{name: (layers, heads)}`` plus the
    peak fields. The baseline of the tests and the benchmark; the model may sit on any device (the
    maps come back to the host)."""
    device = next(model.parameters()).device
    ids = torch.tensor([token_ids], device=device)
    with torch.inference_mode():
        output = model(input_ids=ids, output_attentions=True, use_cache=False)
    precision = torch.float64 if output.attentions[0].dtype == torch.float64 else torch.float32
    layers = [head_statistics.reference(layer[0].to(precision).cpu().numpy(), token_ids=token_ids,
                                        names=head_statistics.CORPUS)
              for layer in output.attentions]  # (H, n, n) per layer
    return {name: np.stack([layer[name] for layer in layers]) for name in FIELDS}
