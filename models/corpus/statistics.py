"""The per-document function of corpus mode: token ids -> per-head statistics, reduced layer by layer in the forward.

For a head's weights A ``(q, k)`` of one document (rows are probability distributions over the visible keys),
each statistic is a mean over the document's queries:
- ``entropy_bits``: −Σ_k A log₂ A (bits); ``mean_distance``: Σ_k A_qk |q − k| (tokens);
- ``first_token``: A_q0, the attention sink (Xiao et al. 2023); ``diagonal``: A_qq;
- ``previous_token``: A_q,q−1 over q ≥ 1 (Olsson et al. 2022's previous-token heads);
- ``induction``: Σ A_q,t over the keys t ≥ 1, t < q whose *previous* token equals token q ("… A B … A → B",
  Olsson et al. 2022), averaged over the queries that have such a key; NaN for a document without repeats;
- ``max_weight``: max_k A_qk (how peaked the head is).
The ``peak`` of a head in a document is its largest weight off the first token and off the diagonal, with the
query and key where it sits: the corpus page's "top examples" are the documents with the highest peaks.
For MoE models: per MoE layer the expert load (share of top-k assignments), the co-activation matrix and the mean
router entropy (nats), from ``models.analysis.routing`` on the document's tokens.

How: documents are padded into small batches and run once through the model's base (no LM head) with a
``capture.observing`` recorder that receives each layer's post-RoPE q and k, recomputes softmax(q kᵀ·s + mask) on the
model's device in float32 and keeps only the ``(batch, heads)`` statistics: memory stays one layer's weights.
``eager_statistics`` is the baseline the benchmark and the tests compare with: ``output_attentions=True`` on an eager
model, one document at a time, numpy on the returned maps.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from models.core import capture, text
from models.corpus.readers import Document

STATISTICS = {
    "entropy_bits": "Entropy (bits)",
    "mean_distance": "Mean distance (tokens)",
    "first_token": "First-token (sink) share",
    "previous_token": "Previous-token score",
    "diagonal": "Self (diagonal) score",
    "induction": "Induction score",
    "max_weight": "Mean max weight",
}
PEAK_FIELDS = ("peak_value", "peak_query", "peak_key")
MAX_BATCH_DOCUMENTS = 8
MAX_BATCH_TOKENS = 2048  # padded tokens per forward: bounds one layer's weights at heads × 2,048 × length floats
# padding a batch may add, as a share of its documents' own tokens. The forward costs the same per token whether a
# token is real or padding, and on a CPU a batch of 8 runs at the per-token speed of one document alone: 24 python-docs
# paragraphs in groups of 8 padded 1,858 tokens to 2,592 (+40%). Documents sorted by length keep the groups full
# where lengths are dense (a large corpus, where a GPU's batching pays).
MAX_PADDING = 0.1


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


@dataclass
class _StatisticsRecorder(capture.Recorder):
    """Reduces each self-attention call to per-head statistics at once (nothing of q or k is kept)."""

    token_ids: torch.Tensor | None = None  # (B, S) on the model's device
    lengths: torch.Tensor | None = None  # (B,)
    layers: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def record(self, module, query, key, attention_mask, kwargs) -> None:
        name = self.module_names.get(id(module), "")
        if self.kind_of(module, name) == "cross":
            return
        q_len, k_len = query.shape[2], key.shape[2]
        scaling = kwargs.get("scaling")
        scaling = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        allowed, bias = self._mask(module, attention_mask, kwargs, q_len, k_len)
        position_bias = kwargs.get("position_bias")
        if position_bias is not None:
            position_bias = position_bias[..., -k_len:].detach().float()
            bias = position_bias if bias is None else bias.to(position_bias.device) + position_bias
        self.layers.append(_layer_statistics(query, key, scaling, allowed, bias, self.token_ids, self.lengths))


def attention_weights(query: torch.Tensor, key: torch.Tensor, scaling: float, allowed: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scaling + bias) in float32 on q's device: query ``(B, H, q, d)``, key ``(B, H_kv, k, d)``,
    allowed bool ``(B or 1, q, k)`` -> ``(B, H, q, k)``; masked entries 0, a row with no visible key all 0."""
    heads, kv_heads = query.shape[1], key.shape[1]
    key = key.float()
    if kv_heads != heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.matmul(query.float(), key.transpose(-1, -2))  # (B, H, q, k)
    scores.mul_(scaling)
    if bias is not None:
        scores.add_(bias.to(scores.device, torch.float32))
    scores.masked_fill_(~allowed.to(scores.device)[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num_(0.0)


def _layer_statistics(query, key, scaling, allowed, bias, token_ids, lengths) -> dict[str, torch.Tensor]:
    """Every statistic of one layer for each document of the batch: ``{name: (B, H)}`` on the CPU."""
    weights = attention_weights(query, key, scaling, allowed, bias)  # (B, H, q, k)
    batch, heads, q_len, k_len = weights.shape
    device = weights.device
    positions = torch.arange(q_len, device=device)
    valid = (positions[None, :] < lengths[:, None]).float()  # (B, q): real tokens, not padding
    count = valid.sum(-1, keepdim=True)  # (B, 1)

    def query_mean(values: torch.Tensor) -> torch.Tensor:  # (B, H, q) -> (B, H)
        return (values * valid[:, None]).sum(-1) / count

    distance = (positions[:, None] - torch.arange(k_len, device=device)[None, :]).abs().float()  # (q, k)
    entropy = -torch.special.xlogy(weights, weights).sum(-1) / math.log(2)  # 0 log 0 = 0
    previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, H, q-1): A[i+1, i]
    previous_valid = valid[:, 1:]
    previous_score = (previous * previous_valid[:, None]).sum(-1) / previous_valid.sum(-1, keepdim=True).clamp_min(1)
    # induction targets: key t (1 <= t < q) whose previous token equals the query's token
    same = token_ids[:, :, None] == token_ids[:, None, :]  # (B, q, k): token q == token k
    targets = torch.zeros_like(same)
    targets[:, :, 1:] = same[:, :, :-1]  # key t is a target when token t-1 == token q
    targets &= torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(-1)[None]  # t < q
    targets &= valid.bool()[:, :, None] & valid.bool()[:, None, :]
    has_target = targets.any(-1).float()  # (B, q)
    induction_mass = (weights * targets[:, None]).sum(-1)  # (B, H, q)
    induction = (induction_mass * has_target[:, None]).sum(-1) / has_target.sum(-1, keepdim=True)  # NaN: no repeats
    # peak: the largest weight off the first token and off the diagonal
    off = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    off[:, 0] = False
    off.fill_diagonal_(False)
    off = off[None] & valid.bool()[:, :, None] & allowed.to(device)  # (B, q, k): real queries, visible keys
    peak_weights = weights.masked_fill(~off[:, None], -1.0).flatten(-2)  # (B, H, q·k)
    peak_value, peak_index = peak_weights.max(-1)
    stats = {
        "entropy_bits": query_mean(entropy),
        "mean_distance": query_mean((weights * distance).sum(-1)),
        "first_token": query_mean(weights[..., 0]),
        "previous_token": previous_score,
        "diagonal": query_mean(weights.diagonal(dim1=-2, dim2=-1)),
        "induction": induction,
        "max_weight": query_mean(weights.amax(-1)),
        "peak_value": torch.where(peak_value >= 0, peak_value, torch.nan),
        "peak_query": torch.where(peak_value >= 0, peak_index // k_len, -1),
        "peak_key": torch.where(peak_value >= 0, peak_index % k_len, -1),
    }
    return {name: value.detach().cpu() for name, value in stats.items()}


def _accepts(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def batches(documents: list[tuple[Document, list[int]]], max_documents: int = MAX_BATCH_DOCUMENTS,
            max_tokens: int = MAX_BATCH_TOKENS, max_padding: float = MAX_PADDING,
            ) -> list[list[tuple[Document, list[int]]]]:
    """Consecutive documents grouped so that documents × longest ≤ ``max_tokens`` and the padding stays within
    ``max_padding`` of the group's own tokens (order kept: resume is by order)."""
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


class StatisticsRunner:
    """The per-document function bound to one loaded model: ``run(documents) -> (statistics, skipped)``.

    Holds only the model and settings, so a Ray actor builds one per process and the in-process engine one per run.
    """

    def __init__(self, loaded, max_tokens: int = 256, max_padding: float = MAX_PADDING):
        model = loaded.model
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError("Corpus statistics read text with one stack of layers (a causal LM, an encoder or a "
                             "decoder-only MoE); encoder–decoder models such as translators are not supported.")
        self.loaded = loaded
        self.max_tokens = max_tokens
        self.max_padding = max_padding
        self.base = getattr(model, "base_model", model) or model  # no LM head: the statistics never need logits
        self.is_moe = _is_moe(model)
        tokenizer = loaded.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.extra = {"use_cache": False} if _accepts(self.base, "use_cache") else {}
        self.names = {id(m): name for name, m in model.named_modules()}
        self.layers, self.heads = _shape(model)

    def tokenize(self, document: Document) -> list[int]:
        return text.tokenize(self.loaded.tokenizer, document.text, self.max_tokens).ids

    def run(self, documents: list[Document]) -> tuple[list[DocumentStatistics], list[tuple[str, str]]]:
        """Statistics of each document that tokenises, and ``(doc_id, reason)`` for each that does not."""
        tokenized, skipped = self._tokenized(documents)
        done = {}
        for group in self._groups(tokenized):
            done.update((item.doc_id, item) for item in self._run_batch(group))
        return [done[document.doc_id] for document, _ in tokenized], skipped

    def forward_only(self, documents: list[Document]) -> None:
        """The same forwards on the same batches with nothing recorded: what any per-document function that runs
        this model must pay at least (the corpus benchmark's ceiling)."""
        for group in self._groups(self._tokenized(documents)[0]):
            ids, attention_mask, _ = self._padded(group)
            with torch.inference_mode():
                self.base(input_ids=ids, attention_mask=attention_mask, **self.extra)

    def _tokenized(self, documents: list[Document]) -> tuple[list[tuple[Document, list[int]]], list[tuple[str, str]]]:
        tokenized, skipped = [], []
        for document in documents:
            try:
                tokenized.append((document, self.tokenize(document)))
            except ValueError as error:
                skipped.append((document.doc_id, str(error)))
        return tokenized, skipped

    def _groups(self, tokenized: list[tuple[Document, list[int]]]) -> list[list[tuple[Document, list[int]]]]:
        # longest first, so that a batch pads to lengths alike (unsorted, 8 documents of ~70 tokens padded to one
        # of 256 did 3× the work); ``run`` gives the results back in the documents' order
        return batches(sorted(tokenized, key=lambda item: -len(item[1])), max_padding=self.max_padding)

    def _padded(self, group: list[tuple[Document, list[int]]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(ids, attention mask) of a group on the model's device, right-padded, and the documents' lengths."""
        lengths = [len(ids) for _, ids in group]
        width = max(lengths)
        ids = torch.full((len(group), width), self.pad_id, dtype=torch.long)
        for row, (_, token_ids) in enumerate(group):
            ids[row, :len(token_ids)] = torch.tensor(token_ids)  # right padding: positions 0..n-1 as when alone
        attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
        return ids.to(self.loaded.device), attention_mask.to(self.loaded.device), lengths

    def _run_batch(self, group: list[tuple[Document, list[int]]]) -> list[DocumentStatistics]:
        device = self.loaded.device
        ids, attention_mask, lengths = self._padded(group)
        width = ids.shape[1]
        recorder = _StatisticsRecorder(module_names=self.names, token_ids=ids,
                                       lengths=torch.tensor(lengths, device=device))
        routing = None
        with torch.inference_mode(), capture.observing(self.loaded.model, recorder):
            if self.is_moe:
                from models.families.moe import model as moe

                with moe.recording(self.loaded.model) as routing:
                    self.base(input_ids=ids, attention_mask=attention_mask, **self.extra)
            else:
                self.base(input_ids=ids, attention_mask=attention_mask, **self.extra)
        stacked = {name: torch.stack([layer[name] for layer in recorder.layers], dim=1).numpy()
                   for name in recorder.layers[0]}  # (B, layers, H)
        results = []
        for row, (document, token_ids) in enumerate(group):
            item = DocumentStatistics(
                document.doc_id, list(token_ids),
                {name: stacked[name][row].astype(np.float32) for name in STATISTICS},
                stacked["peak_value"][row].astype(np.float32), stacked["peak_query"][row].astype(np.int32),
                stacked["peak_key"][row].astype(np.int32))
            if routing is not None:
                _add_routing(item, routing, row, width, lengths[row])
            results.append(item)
        return results


def _add_routing(item: DocumentStatistics, recorder, row: int, width: int, length: int) -> None:
    """Expert load, co-activation and router entropy of one document of the batch (its tokens, not the padding)."""
    from models.analysis import routing as stats
    from models.families.moe import model as moe

    sites = [s for s in recorder.sites if s.name in recorder.calls]
    calls = [recorder.calls[s.name][-1] for s in sites]
    rule = moe.infer_dispatch_rule(calls)
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
    """The same statistics from the maps an eager model returns with ``output_attentions=True``, one document,
    plain numpy: ``{name: (layers, heads)}`` plus the peak fields. The reference of the tests and the benchmark."""
    from models.analysis import heads as head_stats

    ids = torch.tensor([token_ids])
    with torch.inference_mode():
        output = model(input_ids=ids, output_attentions=True, use_cache=False)
    maps = [layer[0].float().numpy() for layer in output.attentions]  # (H, n, n) per layer
    n = len(token_ids)
    tokens = np.asarray(token_ids)
    targets = np.zeros((n, n), dtype=bool)  # [q, t]: t ≥ 1, t < q and token t−1 == token q
    targets[:, 1:] = tokens[None, :-1] == tokens[:, None]
    targets &= np.tri(n, n, -1, dtype=bool)
    has_target = targets.any(-1)
    out = {name: [] for name in (*STATISTICS, *PEAK_FIELDS)}
    for weights in maps:
        basic = head_stats.layer_statistics(weights)
        for name in ("entropy_bits", "mean_distance", "first_token", "previous_token", "diagonal"):
            out[name].append(basic[name])
        out["max_weight"].append(weights.max(-1).mean(-1))
        if has_target.any():
            out["induction"].append((weights * targets).sum(-1)[:, has_target].mean(-1))
        else:
            out["induction"].append(np.full(weights.shape[0], np.nan))
        masked = weights.copy()
        masked[:, :, 0] = -1
        masked[:, np.arange(n), np.arange(n)] = -1
        masked[:, np.triu(np.ones((n, n), dtype=bool), 1)] = -1  # future keys (causal): not seen
        flat = masked.reshape(weights.shape[0], -1)
        index = flat.argmax(-1)
        value = flat.max(-1)
        out["peak_value"].append(np.where(value >= 0, value, np.nan))
        out["peak_query"].append(np.where(value >= 0, index // n, -1))
        out["peak_key"].append(np.where(value >= 0, index % n, -1))
    return {name: np.asarray(values) for name, values in out.items()}
