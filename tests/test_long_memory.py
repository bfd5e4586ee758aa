"""A long prompt run holds little beyond its q/k (bench/case_corpus.py's ``long`` part measures it at 8,192 tokens):
the residual stream only for the last positions, re-run up to a window's end for the logit lens elsewhere, and the
implicit causal mask as its shape. Here the thresholds are lowered so that a 40-token text takes the long path, and
each answer is compared with the short path's (whole stream, dense mask), which test_lens checks against an
independent forward."""
from __future__ import annotations

import numpy as np
import pytest

from models import families
from models.analysis import lens
from models.core import capture
from models.core.inputs import TextInput
from models.core.results import CausalMask
from models.families.causal_lm import model as causal_lm
from tests.conftest import save_tiny
from viz.figures.lens import LensOptions

TEXT = ("the cat sat on the mat and the dog sat on the rug while a bird sang in the tree and the sun rose over the "
        "hills of the quiet town")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def runs(request, tmp_path_factory):
    """The same model and text run the short way (everything kept) and the long way (thresholds at 8 tokens)."""
    folder = save_tiny(request.param, tmp_path_factory.mktemp("long") / request.param)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
        loaded = families.load(families.custom("causal_lm", str(folder)))
        short = families.run(loaded, TextInput(TEXT, 64))
        patch.setattr(capture, "HALF_PRECISION_TOKENS", 8)
        patch.setattr(causal_lm, "RESIDUAL_FULL_TOKENS", 8)
        patch.setattr(causal_lm, "RESIDUAL_WINDOW", 6)
        long = families.run(loaded, TextInput(TEXT, 64))
        yield loaded, short, long


def test_a_long_run_keeps_the_last_positions_of_the_stream_equal_to_the_whole_streams(runs):
    loaded, short, long = runs
    n = len(short.tokens)
    assert n > 20 and long.tokens == short.tokens
    assert long.residual_start == n - 6 and long.residual.shape == (short.residual.shape[0], 6, short.residual.shape[2])
    assert long.residual.dtype == np.float32
    np.testing.assert_allclose(long.residual, short.residual[:, n - 6:], atol=1e-5)
    assert short.residual_start == 0


def test_the_lens_reruns_a_window_the_long_run_did_not_keep_and_matches_the_whole_stream(runs):
    loaded, short, long = runs
    n = len(short.tokens)
    for options in (LensOptions(positions=4, last=-1), LensOptions(positions=8, last=n - 10),
                    LensOptions(positions=5, last=4)):
        expected = lens.logit_lens(loaded, short, options)
        found = lens.logit_lens(loaded, long, options)
        assert found.positions == expected.positions
        np.testing.assert_array_equal(found.top_ids, expected.top_ids)
        np.testing.assert_allclose(found.top_probs, expected.top_probs, atol=1e-5)  # float32 both: same forward
        np.testing.assert_allclose(found.final_probs, expected.final_probs, atol=1e-5)


def test_the_rerun_window_equals_the_forwards_own_hidden_states(runs):
    loaded, short, _ = runs
    ids = list(short.token_ids)
    window = lens.residual_window(loaded, ids, 3, 11)
    np.testing.assert_allclose(window, short.residual[:, 3:11], atol=1e-5)  # a prefix forward: the same positions


def test_the_long_runs_causal_mask_is_its_shape_and_the_maps_stay_those_of_the_dense_mask(runs):
    _, short, long = runs
    dense, lazy = short.maps("self"), long.maps("self")
    assert all(isinstance(mask, CausalMask) for mask in lazy.allowed_masks) and lazy.nbytes() < dense.nbytes()
    for layer in range(dense.num_layers):
        np.testing.assert_array_equal(lazy.allowed(layer), dense.allowed(layer))
        np.testing.assert_allclose(lazy.layer(layer), dense.layer(layer), atol=2e-3)  # float16 q/k
        np.testing.assert_allclose(lazy.head(layer, 1), dense.head(layer, 1), atol=2e-3)


def test_a_causal_mask_array_crops_keys_past_the_queries():
    allowed = CausalMask(3, 5).array()
    np.testing.assert_array_equal(allowed, [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    assert CausalMask(3, 5).nbytes == 0 and CausalMask(3, 5).shape == (3, 5)


def test_on_a_gpu_the_run_keeps_the_last_window_of_the_stream_at_any_length():
    """Copying the whole stream to the host cost 14× a GPU's forward at 4,096 tokens; the CPU keeps it whole up to
    ``RESIDUAL_FULL_TOKENS`` as before."""
    window = causal_lm.RESIDUAL_WINDOW
    assert causal_lm.residual_full_tokens("cuda") == causal_lm.residual_full_tokens("cuda:1") == window
    assert causal_lm.residual_full_tokens("cpu") == causal_lm.RESIDUAL_FULL_TOKENS
