"""Concurrent sessions on one shared (cached) model: no cross-talk through capture state, tokenizers or RNGs.

A Streamlit server runs every browser session's script in its own thread against the *same* cached model objects
(``st.cache_resource``). This soak starts ``WORKERS`` threads at once on one tiny causal LM and one tiny encoder,
each with its own inputs (attention on a prompt, greedy and seeded-sampling generation, an encoder sentence), for a
bounded time, and requires every result to be bit-identical to the result the same input gives alone.

The harness is shown to fail: with the capture's per-thread recorder swapped for one shared slot (what storing the
recorder on a module or on the model would do) it reports the mixed-up results.

``ATTN_EXPLORER_SOAK_SECONDS`` sets the soak time (default 8 s in the suite; the issue's 2-minute soak is
``ATTN_EXPLORER_SOAK_SECONDS=120 pytest tests/test_concurrency.py``).
"""
from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass

import pytest

from models.core import capture
from models.core.inputs import TextInput
from models.families.causal_lm import model as causal_lm
from models.families.encoder import model as encoder
from tests import tiny_text_models

WORKERS = 8
SOAK_SECONDS = float(os.environ.get("ATTN_EXPLORER_SOAK_SECONDS", "8"))

PROMPTS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog", "def add(a, b): return a + b",
           "one two three four five six", "the dog sat on the log and the cat sat on the mat",
           "🙂 emoji and مرحبا", "<b>tags</b> stay text", "ten nine eight seven six five four three two one"]


@dataclass(frozen=True)
class Job:
    kind: str  # "attention", "greedy", "sampling", "encoder"
    text: str
    seed: int = 0


def jobs_of(worker: int) -> list[Job]:
    """Each worker's own inputs: different prompts and seeds from every other worker."""
    prompt = PROMPTS[worker % len(PROMPTS)]
    return [Job("attention", prompt), Job("encoder", prompt), Job("greedy", prompt),
            Job("sampling", prompt, seed=worker * 7 + 1)]


def fingerprint(models: dict, job: Job) -> tuple:
    """Everything a page shows for ``job``: tokens, every layer's weights, probabilities, generated text."""
    if job.kind == "encoder":
        result = encoder.run(models["encoder"], TextInput(job.text))
    elif job.kind == "attention":
        result = causal_lm.run(models["causal_lm"], TextInput(job.text))
    else:
        settings = causal_lm.GenerationSettings(max_new_tokens=6, strategy="greedy" if job.kind == "greedy"
                                                else "sampling", temperature=1.5, top_k=0, top_p=1.0, seed=job.seed)
        result = causal_lm.run(models["causal_lm"], TextInput(job.text), settings)
    maps = result.maps("self")
    layers = tuple(maps.layer(layer).tobytes() for layer in range(maps.num_layers))
    next_token = tuple((t.token_id, t.probability) for t in result.next_token)
    generated = tuple((step.position, step.token, step.probability) for step in result.generation)
    return tuple(result.tokens), layers, next_token, generated


def soak(models: dict, workers: int, seconds: float, stop_at_first_failure: bool = False) -> tuple[int, list[str]]:
    """Run every worker's jobs in a loop from one start signal until ``seconds`` pass; (runs, failures).

    References are computed first, one job at a time, in this thread: what each input gives alone.
    """
    references = {job: fingerprint(models, job) for worker in range(workers) for job in jobs_of(worker)}
    start, deadline = threading.Barrier(workers), [0.0]
    failures: list[str] = []
    runs = [0] * workers
    stop = threading.Event()

    def work(worker: int) -> None:
        start.wait()
        deadline[0] = deadline[0] or time.monotonic() + seconds
        while time.monotonic() < deadline[0] and not stop.is_set():
            for job in jobs_of(worker):
                try:
                    got = fingerprint(models, job)
                except Exception:  # noqa: BLE001 - any exception under concurrency is a failure to report
                    failures.append(f"worker {worker} {job}: {traceback.format_exc(limit=3)}")
                else:
                    if got != references[job]:
                        failures.append(f"worker {worker} {job}: differs from its single-threaded result "
                                        f"({describe_difference(got, references[job])})")
                    runs[worker] += 1
                if failures and stop_at_first_failure:
                    stop.set()

    threads = [threading.Thread(target=work, args=(worker,), name=f"session-{worker}") for worker in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    assert not any(thread.is_alive() for thread in threads), "a worker hung"
    return sum(runs), failures


def describe_difference(got: tuple, want: tuple) -> str:
    names = ("tokens", "attention", "next-token probabilities", "generation")
    return ", ".join(name for name, a, b in zip(names, got, want) if a != b)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("concurrency_models")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(root))
        return {"causal_lm": tiny_text_models.load_local("causal_lm", tiny_text_models.save_tiny_causal_lm(
                    root / "lm")),
                "encoder": tiny_text_models.load_local("encoder", tiny_text_models.save_tiny_encoder(root / "bert"))}


def test_inputs_differ_between_workers(models):
    """Cross-talk is only visible if the workers' results differ: check that they do."""
    attention = {fingerprint(models, jobs_of(worker)[0]) for worker in range(WORKERS)}
    sampled = {fingerprint(models, jobs_of(worker)[3])[3] for worker in range(WORKERS)}
    assert len(attention) == WORKERS and len(sampled) >= WORKERS - 1


def test_eight_sessions_at_once_match_their_single_threaded_results(models):
    runs, failures = soak(models, WORKERS, SOAK_SECONDS)
    print(f"{WORKERS} threads, {SOAK_SECONDS:g} s: {runs} runs, {len(failures)} failures")
    assert not failures, f"{len(failures)} of {runs} runs went wrong; first: {failures[0]}"
    assert runs >= WORKERS * len(jobs_of(0))  # every worker finished at least one round


class SharedSlot:
    """A ContextVar look-alike with one slot for all threads: the bug a module-level recorder would be."""

    def __init__(self):
        self.value = None

    def get(self):
        return self.value

    def set(self, value):
        previous, self.value = self.value, value
        return previous

    def reset(self, previous):
        self.value = previous


def test_the_soak_catches_a_recorder_shared_between_sessions(models, monkeypatch):
    monkeypatch.setattr(capture, "_ACTIVE", SharedSlot())
    runs, failures = soak(models, WORKERS, seconds=30, stop_at_first_failure=True)
    assert failures, f"{runs} runs with a shared recorder and no failure seen: this soak could not fail"
