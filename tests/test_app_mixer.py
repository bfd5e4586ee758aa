"""AppTest of the MLP-Mixer page on the shipped minis (mini Mixer shapes beside mini ViT shapes): the default view
teaches the page's lesson (the Mixer's fixed map stays the same when the image changes, the ViT's attention does not),
the query patch is outlined in red on both pictures, and every interaction changes what it should."""
from __future__ import annotations

import numpy as np
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT

TIMEOUT = 180


def _page() -> AppTest:
    return AppTest.from_file(str(ROOT / "app" / "views" / "mixer.py"), default_timeout=TIMEOUT)


def _captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


def _red_at(figure, row: int, col: int) -> bool:
    """Whether the top edge of patch (row, col) of an 8 × 8 grid is drawn in the query's red."""
    picture = np.asarray(figure.image)
    step = picture.shape[0] // 8
    return tuple(picture[row * step + 2, col * step + step // 2]) == (255, 0, 0)


def test_default_view_sets_the_fixed_map_beside_attention_and_marks_the_query(offered):
    at = _page().run()
    assert not at.exception, at.exception
    assert at.radio(key="mixer_map").value == "fixed" and at.selectbox(key="mixer_vit").value.startswith(
        "mini ViT shapes")
    assert at.slider(key="mixer_layer").value == 5 and (at.slider(key="mixer_row").value,
                                                        at.slider(key="mixer_col").value) == (4, 4)
    assert "patch (4, 4) (outlined in red) mixes from" in _captions(at)
    assert "where patch (4, 4) attends (outlined in red)" in _captions(at)
    mixed, attended = offered["mixer_mixing"], offered["mixer_vit_query"]
    assert _red_at(mixed, 4, 4) and _red_at(attended, 4, 4)
    assert not _red_at(mixed, 2, 2) and not _red_at(attended, 2, 2)

    # the lesson: another image leaves the Mixer's fixed map exactly as it was; the ViT's attention moves
    at.button(key="mixer_sample_rocket").click().run()
    assert not at.exception, at.exception
    np.testing.assert_array_equal(offered["mixer_mixing"].payload()["signed_row"], mixed.payload()["signed_row"])
    assert not np.allclose(offered["mixer_vit_query"].payload()["values"], attended.payload()["values"])

    at.radio(key="mixer_map").set_value("input").run()
    assert "at this image (Jacobian, mean over channels) map" in _captions(at)
    assert not np.allclose(offered["mixer_mixing"].payload()["signed_row"], mixed.payload()["signed_row"])
    at.slider(key="mixer_row").set_value(1).run()
    at.slider(key="mixer_col").set_value(6).run()
    assert "patch (1, 6) (outlined in red) mixes from" in _captions(at)
    assert "where patch (1, 6) attends (outlined in red)" in _captions(at)
    assert _red_at(offered["mixer_mixing"], 1, 6) and _red_at(offered["mixer_vit_query"], 1, 6)
    at.slider(key="mixer_layer").set_value(0).run()
    assert "block 0" in _captions(at) and offered["mixer_matrix"].metadata["layer"] == "0"
    assert not at.exception and not at.error
