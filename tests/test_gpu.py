"""What needs a CUDA GPU beyond the kernels (tests/test_tiles.py): q and k stay on the device in the model's dtype, and
the views read there equal the CPU's. No Streamlit import here, so a GPU machine with only PyTorch runs it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models.core import capture
from models.core.results import RecomputedAttention
from tests.conftest import tiny_model


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.cuda
def test_on_a_gpu_q_and_k_stay_there_in_the_models_dtype_and_the_views_equal_the_cpus():
    model = tiny_model("llama").to("cuda", torch.bfloat16)
    ids = torch.randint(5, 30000, (1, 300), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode(), capture.recording(model) as recorder:
        model(input_ids=ids.cuda(), use_cache=False, logits_to_keep=1)
    maps = recorder.attention_maps("self")
    assert all(t.is_cuda and t.dtype == torch.bfloat16 for t in maps.queries + maps.keys)
    assert set(maps.held_bytes()) == {"cuda:0"} and maps.streams
    host = RecomputedAttention(maps.kind, maps.query_tokens, maps.key_tokens, [q.cpu() for q in maps.queries],
                               [k.cpu() for k in maps.keys], maps.scalings, maps.allowed_masks, maps.mask_index)
    for head in (0, 3, None):
        found, expected = maps.tiles(1, head, tile=4), host.tiles(1, head, tile=4)
        np.testing.assert_allclose(found.maximum, expected.maximum, atol=1e-5)
        np.testing.assert_allclose(found.mean, expected.mean, atol=1e-5)
        np.testing.assert_allclose(maps.row(1, head, 299), host.row(1, head, 299), atol=1e-5)
    found, expected = maps.layer_summary(0), host.layer_summary(0)
    np.testing.assert_allclose(found[0], expected[0], atol=1e-5)
    for name in expected[1]:
        np.testing.assert_allclose(found[1][name], expected[1][name], atol=1e-4, err_msg=name)


def test_a_key_in_context_reads_as_the_text_and_stays_plain_text():
    from viz.figures.rows import in_context

    labels = ["Mrs", "D", "urs", "ley", "of", "number", "four", "↵", "<b>"]
    pieces = (" Mrs", " D", "urs", "ley", " of", " number", " four", "\n", "<b>")
    assert in_context(labels, 2, 3, pieces) == "Mrs D⟦urs⟧ley of number …"
    assert in_context(labels, 6, 2, pieces) == "… of number ⟦four⟧↵<b>"  # a line break as its marker
    assert in_context(labels, 2, 2) == "Mrs D ⟦urs⟧ ley of …"  # no pieces (an encoder's keys): labels and spaces
