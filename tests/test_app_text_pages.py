"""AppTest of the GPT and encoder pages with the loader patched to tiny models: no exception, charts present."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT

TIMEOUT = 120


def _page(name: str) -> AppTest:
    return AppTest.from_file(str(ROOT / "app" / "views" / f"{name}.py"), default_timeout=TIMEOUT)


def _charts(at: AppTest) -> int:
    return len(at.get("vega_lite_chart")) + len(at.get("image"))


def test_gpt_page_shows_attention_and_next_tokens(patched_loader):
    at = _page("gpt").run()
    assert not at.exception, at.exception
    assert _charts(at) >= 2  # one head and the next-token bars (tabs are lazy: only the open one runs)
    assert any("tokens" in c.value for c in at.caption)
    at.session_state["gpt_view"] = "All heads (model view)"
    at.run()
    assert not at.exception, at.exception
    assert _charts(at) >= 3  # + the layer × head chart and the thumbnails
    assert len(at.dataframe) == 1  # the sortable per-head statistics table


def test_gpt_page_empty_prompt_gives_a_hint(patched_loader):
    at = _page("gpt").run()
    at.text_area[0].set_value("   ").run()
    assert not at.exception
    assert any("Type a prompt" in info.value for info in at.info)


@pytest.mark.parametrize("prompt", ["<script>alert(1)</script>", "🙂‮evil‬", "word " * 3000, "a\x00b\u200bc"])
def test_gpt_page_survives_odd_prompts(patched_loader, prompt):
    at = _page("gpt").run()
    at.text_area[0].set_value(prompt).run()
    assert not at.exception, at.exception
    assert _charts(at) >= 2  # the open tab (one head) and the next-token bars


def test_gpt_page_generates_and_steps_through(patched_loader):
    at = _page("gpt").run()
    at.button[0].click().run()  # the form's Generate button
    assert not at.exception, at.exception
    assert at.slider(key="gpt_step") is not None
    at.slider(key="gpt_step").set_value(2).run()
    assert not at.exception


def test_gpt_page_layer_and_head_controls_rerender(patched_loader):
    at = _page("gpt").run()
    at.slider(key="gpt_layer").set_value(1).run()
    at.selectbox(key="gpt_head").set_value("average of heads").run()
    assert not at.exception


def test_encoder_page_shows_special_token_share(patched_loader):
    at = _page("encoder").run()
    assert not at.exception, at.exception
    assert any("[CLS]" in s.value or "special" in s.value for s in at.subheader)
    assert _charts(at) >= 2  # one head (tabs are lazy) and the special-token share


def test_unknown_local_model_is_a_message_not_a_traceback(patched_loader):
    at = _page("gpt").run()
    at.selectbox(key="model_causal_lm").set_value("Other: a hub id or a local folder…").run()
    at.text_input(key="custom_model_causal_lm").set_value("../../etc").run()
    assert not at.exception
    assert at.error and "outside the folders" in at.error[0].value
