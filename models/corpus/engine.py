"""Engines that run the per-document function over a corpus and persist each batch: in process, or Ray Data.

Both call ``StatisticsRunner.run`` on the same batches of documents, so both give the same numbers; only where the
model lives differs. In process: the caller's loaded model, one batch after another. Ray: ``map_batches`` over a pool
of actors (``compute=ActorPoolStrategy(size=actors)``), each of which loads the model once from its ``ModelSpec``
(one GPU per actor when there are GPUs), on a local ``ray.init()`` or the cluster named by ``RAY_ADDRESS``. Rows
stream back to the driver, which appends each batch to the results folder as it arrives, so a kill loses at most
the batches in flight and a re-run skips every document already written.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from models.corpus.readers import Corpus, Document
from models.corpus.statistics import StatisticsRunner
from models.corpus.store import ResultStore, RunInfo, document_row, skipped_row

ENGINES = ("local", "ray")
ROOT = Path(__file__).resolve().parents[2]
BATCH_DOCUMENTS = 32  # documents per persisted batch on a CPU: what a kill can lose (a few seconds of work)


@dataclass(frozen=True)
class Progress:
    done: int  # documents finished in this run (skipped ones included)
    total: int  # documents this run had to do
    tokens: int  # tokens read in this run
    elapsed_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        if not self.done or self.elapsed_s <= 0:
            return None
        return (self.total - self.done) * self.elapsed_s / self.done


def run_info(loaded, corpus: Corpus, max_tokens: int) -> RunInfo:
    from models.corpus.statistics import _shape
    from models.families.moe import model as moe

    layers, heads = _shape(loaded.model)
    experts = moe_layers = 0
    if moe.is_moe_model(loaded.model):
        sites = moe.router_sites(loaded.model)
        moe_layers = len(sites)
        config = loaded.model.config
        experts = int(getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0) or 0)
    return RunInfo(loaded.spec.key, corpus.name, max_tokens, layers, heads, corpus.licence, experts, moe_layers,
                   str(getattr(loaded, "dtype", "float32")))


def rows_for(runner: StatisticsRunner, documents: list[Document], also=()) -> list[dict]:
    """The per-document function on a batch, as store rows (documents that do not tokenise: skipped rows);
    ``also``: more reductions that read the same forwards."""
    by_id = {d.doc_id: d for d in documents}
    results, skipped = runner.run(documents, also)
    rows = [document_row(item, by_id[item.doc_id].source, by_id[item.doc_id].text) for item in results]
    rows += [skipped_row(doc_id, reason, by_id[doc_id].source) for doc_id, reason in skipped]
    return rows


def windows(runner: StatisticsRunner, pending: list[Document], batch_documents: int | None) -> list[list[Document]]:
    """The persisted batches of a local run: ``batch_documents`` documents each (default: ``BATCH_DOCUMENTS``, or
    what fills a few of a GPU's forwards), each sorted and padded into forwards by the runner."""
    size = batch_documents or max(BATCH_DOCUMENTS, 4 * runner.limits.documents)
    return [pending[start:start + size] for start in range(0, len(pending), size)]


def run_corpus(corpus: Corpus, loaded, folder: str | Path, engine: str = "local", max_tokens: int = 256,
               progress: Callable[[Progress], None] | None = None, should_stop: Callable[[], bool] | None = None,
               batch_documents: int | None = None, actors: int = 2, also=()) -> ResultStore:
    """Statistics of every document of ``corpus`` not yet in ``folder``, written batch by batch.

    ``loaded``: the model (the Ray engine reads only its spec, device and dtype; its actors load their own).
    ``should_stop``: checked after each batch (the page's cancel button); what was written stays.
    ``also``: reductions that read the same forwards as the statistics (``analysis.PatternShare``,
    ``analysis.QueryKeySample``: the A→B search and the query–key embedding in the same pass); local engine only.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if also and engine != "local":
        raise ValueError("the A→B search and the query–key sample read the forwards in this process: use the "
                         "local engine for them (the Ray engine computes the statistics)")
    store = ResultStore(folder, run_info(loaded, corpus, max_tokens))
    done = store.done()
    store.append([skipped_row(s.doc_id, s.reason) for s in corpus.skipped if s.doc_id not in done])
    pending = [d for d in corpus.documents if d.doc_id not in done]
    started, finished, tokens = time.perf_counter(), 0, 0

    def report(rows: list[dict]) -> bool:
        nonlocal finished, tokens
        store.append(rows)
        finished += len(rows)
        tokens += sum(row["n_tokens"] for row in rows)
        if progress is not None:
            progress(Progress(finished, len(pending), tokens, time.perf_counter() - started))
        return bool(should_stop and should_stop())

    if progress is not None:
        progress(Progress(0, len(pending), 0, 0.0))
    if not pending:
        return store
    if engine == "local":
        runner = StatisticsRunner(loaded, max_tokens)
        for window in windows(runner, pending, batch_documents):
            if report(rows_for(runner, window, also)):
                break
    else:
        for rows in _ray_batches(pending, loaded, max_tokens, batch_documents or BATCH_DOCUMENTS, actors):
            if report(rows):
                break
    return store


# --- Ray Data ------------------------------------------------------------------------------------------------

class CorpusActor:
    """One model per actor process, loaded once; ``__call__`` is the per-document function on one batch."""

    def __init__(self, spec, device: str, dtype: str, max_tokens: int, threads: int = 1):
        import torch

        from models import families

        torch.set_num_threads(threads)  # one actor per core: actors must not fight over the cores
        # on a GPU node Ray sets CUDA_VISIBLE_DEVICES to this actor's one GPU: "cuda" is that GPU
        self.runner = StatisticsRunner(families.load(spec, device, dtype), max_tokens)

    def __call__(self, batch: dict) -> dict:
        documents = [Document(str(i), str(t), str(s)) for i, t, s in zip(batch["doc_id"], batch["text"],
                                                                         batch["source"])]
        return {"row": [json.dumps(row) for row in rows_for(self.runner, documents)]}


def ray_init() -> None:
    """A local Ray (or the cluster in ``RAY_ADDRESS``), with this project importable on its workers."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    env = {name: os.environ[name] for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "ATTN_EXPLORER_MODEL_DIRS",
                                               "HF_HOME") if name in os.environ}
    if address:  # another machine: ship the code (not the sample weights or git history) to the workers
        runtime_env = {"working_dir": str(ROOT), "env_vars": env,
                       "excludes": [".git", ".venv", "bench/*.jsonl", "tests/e2e", "*.png"]}
    else:  # this machine: workers import the code where it is
        runtime_env = {"env_vars": {**env, "PYTHONPATH": str(ROOT)}}
    ray.init(address=address or None, runtime_env=runtime_env, include_dashboard=False, log_to_driver=False,
             configure_logging=False)


def actor_resources(cluster_gpus: float, device: str, actors: int) -> tuple[str, int, int]:
    """(device, GPUs per actor, actors): on a cluster with GPUs every actor takes one (``num_gpus=1``) and runs on
    it, and there are no more actors than GPUs; without, each actor takes one CPU core on the driver's device."""
    gpus = int(cluster_gpus)
    if gpus >= 1:
        return "cuda", 1, max(1, min(actors, gpus))
    if device.startswith("cuda"):
        raise ValueError("the model is on a GPU but the Ray cluster has none: run the Ray engine on a cluster with "
                         "GPUs, or load the model on the CPU")
    return device, 0, actors


def _ray_batches(pending: list[Document], loaded, max_tokens: int, batch_documents: int, actors: int):
    """Rows of each finished batch as Ray Data hands them back (in any order)."""
    try:
        import ray
        from ray.data import ActorPoolStrategy
    except ImportError as error:
        raise ValueError('The Ray engine needs Ray Data: pip install "ray[data]" (or use --engine local).') from error
    ray_init()
    ray.data.DataContext.get_current().enable_progress_bars = False
    device, gpus, actors = actor_resources(ray.cluster_resources().get("GPU", 0), str(loaded.device), actors)
    items = [{"doc_id": d.doc_id, "text": d.text, "source": d.source} for d in pending]
    # every actor gets work: with 24 documents in blocks of 16 there was one block, and one actor did it all
    batch_documents = max(1, min(batch_documents, math.ceil(len(items) / actors)))
    dataset = ray.data.from_items(items, override_num_blocks=max(1, math.ceil(len(items) / batch_documents)))
    out = dataset.map_batches(CorpusActor, batch_size=batch_documents, compute=ActorPoolStrategy(size=actors),
                              num_gpus=gpus, num_cpus=1, batch_format="numpy",
                              fn_constructor_kwargs={"spec": loaded.spec, "device": device,
                                                     "dtype": loaded.dtype, "max_tokens": max_tokens})
    for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
        yield [json.loads(row) for row in batch["row"]]
