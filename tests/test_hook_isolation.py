"""Hooks act only for the call that installed them (models/core/hooks.py): two sessions running the same cached model
at once each get exactly what they get alone.

A Streamlit server runs each browser session's script in its own thread against one cached model. Forward hooks fire
for every forward while they are registered, whoever runs it; before models/core/hooks.py the GPT page's long-prompt
path (``causal_lm._stream_slices``, prompts over ``RESIDUAL_FULL_TOKENS``) hooked the shared model with no per-call
guard, so two visitors running long prompts at once each got the other's residual-stream slices. These tests run two
different inputs at once, many rounds, for the long prompt run, head ablation and activation patching, and require
each result to equal its solo run; the last test shows the harness catches hooks that act for everyone.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from models.analysis import ablation, patching
from models.core import hooks, sites
from models.core.inputs import TextInput
from models.families.causal_lm import model as causal_lm
from tests import tiny_text_models
from viz.figures.ablation import AblationOptions
from viz.figures.patching import PatchingOptions

ROUNDS = 6
LONG = causal_lm.RESIDUAL_FULL_TOKENS + 300  # past the full-residual limit: the run keeps a window by hooks


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("hook_isolation")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(root))
        return tiny_text_models.load_local("causal_lm", tiny_text_models.save_tiny_causal_lm(
            root / "lm", positions=2 * LONG))


def long_prompt(loaded, words: str) -> TextInput:
    """A prompt of at least ``LONG`` tokens made of ``words``."""
    text = words
    while len(loaded.tokenizer(text)["input_ids"]) < LONG:
        text += " " + words
    return TextInput(text, LONG + 64)


def at_once(jobs: list, model, rounds: int = ROUNDS) -> list[list]:
    """Run every job (a function of no arguments) in its own thread from one start signal, ``rounds`` times;
    per job, what each round returned (an exception is returned, not raised).

    Left to the scheduler, two small forwards may never overlap; a rendezvous before ``model``'s first layer makes
    each forward of one session wait for the other's, so both sessions' hooks are registered while each runs."""
    results = [[] for _ in jobs]
    start = threading.Barrier(len(jobs))
    rendezvous = threading.Barrier(len(jobs), timeout=5)

    def wait_for_the_other(*_):
        try:
            rendezvous.wait()
        except threading.BrokenBarrierError:  # the other session has finished its forwards: go on alone
            pass

    def work(index: int) -> None:
        for _ in range(rounds):
            start.wait()
            try:
                results[index].append(jobs[index]())
            except Exception as error:  # noqa: BLE001 - reported by the caller's comparison
                results[index].append(error)

    handle = sites.of(model).layers[0].register_forward_pre_hook(wait_for_the_other)
    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(jobs))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
    finally:
        handle.remove()
    assert not any(thread.is_alive() for thread in threads), "a session hung"
    return results


def stream_of(loaded, inputs):
    def run():
        result = causal_lm.run(loaded, inputs)
        return result.residual_start, np.array(result.residual)
    return run


def test_two_long_prompts_at_once_each_get_their_own_residual_stream(loaded):
    first, second = long_prompt(loaded, "the cat sat on the mat."), long_prompt(loaded, "one two three four five")
    jobs = [stream_of(loaded, first), stream_of(loaded, second)]
    alone = [job() for job in jobs]
    assert alone[0][0] > 0 and alone[1][0] > 0, "the prompts must be long enough for the windowed stream"
    assert not np.array_equal(alone[0][1], alone[1][1])
    for index, rounds in enumerate(at_once(jobs, loaded.model)):
        for got in rounds:
            assert not isinstance(got, Exception), f"session {index} failed: {got!r}"
            assert got[0] == alone[index][0] and np.array_equal(got[1], alone[index][1]), \
                f"session {index}'s residual stream differs from its solo run"


def analysis_of(loaded, text: str, analysis, options):
    result = causal_lm.run(loaded, TextInput(text, 64))
    return lambda: analysis(loaded, result, options)


@pytest.mark.parametrize("analysis, options, values", [
    (ablation.head_ablation, AblationOptions("", "mean"), lambda found: found.effect),
    (patching.activation_patching, None, lambda found: np.concatenate([found.residual.ravel(), found.heads.ravel()])),
])
def test_two_analyses_at_once_each_equal_their_solo_run(loaded, analysis, options, values):
    prompts = ["the cat sat on the mat. the dog", "one two three four five six seven"]
    if options is None:  # patching: each prompt against a corrupted one of its own length
        jobs = [analysis_of(loaded, clean, analysis, PatchingOptions(corrupt)) for clean, corrupt in
                (("the cat sat on the mat. the dog", "the dog sat on the mat. the cat"),
                 ("a quick brown fox jumps over the lazy dog", "a quick brown dog jumps over the lazy fox"))]
    else:
        jobs = [analysis_of(loaded, prompt, analysis, options) for prompt in prompts]
    alone = [values(job()) for job in jobs]
    assert not np.array_equal(alone[0], alone[1])
    for index, rounds in enumerate(at_once(jobs, loaded.model)):
        for got in rounds:
            assert not isinstance(got, Exception), f"session {index} failed: {got!r}"
            assert np.array_equal(values(got), alone[index]), f"session {index} differs from its solo run"


def test_the_harness_catches_hooks_that_act_for_everyone(loaded, monkeypatch):
    """With the per-call guard removed (every hook acts for every forward), the same runs mix up."""
    # in lock-step both sessions switch off the same head at once: one zeroes it, the other sets it to its mean, so
    # a hook acting in the other's forward changes what that forward computes
    jobs = [analysis_of(loaded, prompt, ablation.head_ablation, AblationOptions("", mode))
            for prompt, mode in (("the cat sat on the mat. the dog", "zero"),
                                 ("a quick brown fox jumps over the lazy dog", "mean"))]
    alone = [job().effect for job in jobs]
    monkeypatch.setattr(hooks, "_for_block", lambda fn, block: fn)
    mixed = at_once(jobs, loaded.model, rounds=1)
    assert any(isinstance(got, Exception) or not np.array_equal(got.effect, alone[index])
               for index, rounds in enumerate(mixed) for got in rounds), \
        "with hooks acting for everyone, the two ablations should have disturbed each other"
