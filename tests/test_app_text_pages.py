"""AppTest of the GPT and encoder pages with the loader patched to tiny models: no exception, charts present."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from models.core import selection
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT, url_param

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


def heatmap_weights(at: AppTest) -> np.ndarray:
    """The (queries, keys) weights the page's one-head heatmap draws, read back from the chart's own data."""
    chart = next(c for c in at.get("vega_lite_chart") if '"mark": {"type": "rect"}' in c.proto.spec)
    frame = pa.ipc.open_stream(chart.proto.datasets[0].data.data).read_all().to_pandas()
    return frame.pivot(index="query position", columns="key position", values="weight").to_numpy()


def test_gpt_page_layer_and_head_controls_redraw_the_chosen_head(patched_loader):
    """Moving the layer slider and the head picker redraws the heatmap with exactly that head's weights."""
    from models import families
    from models.core.inputs import TextInput

    at = _page("gpt").run()
    loaded = families.load(families.default_spec("causal_lm"))  # the same tiny model the page was given
    maps = families.run(loaded, TextInput(at.text_area(key="gpt_text").value, 512)).maps("self")
    first = heatmap_weights(at)
    layer, head = _shown_head(at, "gpt")  # the head the sample opens on
    np.testing.assert_allclose(first, maps.head(layer, head), atol=1e-6)
    at.slider(key="gpt_layer").set_value(1 - layer).run()
    assert not at.exception, at.exception
    np.testing.assert_allclose(heatmap_weights(at), maps.head(1 - layer, head), atol=1e-6)
    at.slider(key="gpt_layer").set_value(1).run()
    at.selectbox(key="gpt_head").set_value(2).run()
    np.testing.assert_allclose(heatmap_weights(at), maps.head(1, 2), atol=1e-6)
    at.selectbox(key="gpt_head").set_value("mean").run()
    np.testing.assert_allclose(heatmap_weights(at), maps.head(1, None), atol=1e-6)
    assert not np.allclose(first, heatmap_weights(at))


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


def test_gpt_page_long_input_shows_the_overview_and_zooms_cell_by_cell(patched_loader):
    """Past 64 tokens a side the head is an image of the whole map beside a 64 × 64 region drawn cell by cell; the
    zoom sliders move the region and the region's cells are the model's weights there."""
    from models import families
    from models.core.inputs import TextInput

    prompt = " ".join(f"word{i % 37}" for i in range(150))
    at = _page("gpt")
    at.session_state["gpt_text"] = prompt
    at.run()
    assert not at.exception, at.exception
    assert at.slider(key="gpt_zoom_q") is not None and at.slider(key="gpt_zoom_k") is not None
    assert any("Drag a rectangle" in c.value for c in at.caption)
    loaded = families.load(families.default_spec("causal_lm"))
    maps = families.run(loaded, TextInput(prompt, 512)).maps("self")
    n = len(maps.query_tokens)
    assert n > 64
    np.testing.assert_allclose(heatmap_weights(at), maps.head(0, 0)[n - 64:, n - 64:], atol=1e-6)  # the default
    at.slider(key="gpt_zoom_q").set_value((10, 40)).run()
    at.slider(key="gpt_zoom_k").set_value((0, 30)).run()
    assert not at.exception, at.exception
    np.testing.assert_allclose(heatmap_weights(at), maps.head(0, 0)[10:41, 0:31], atol=1e-6)
    at.selectbox(key="gpt_head").set_value(3).run()
    np.testing.assert_allclose(heatmap_weights(at), maps.head(0, 3)[10:41, 0:31], atol=1e-6)


def head_chart_title(at: AppTest) -> str:
    """The title of the page's one-head heatmap ("layer 1, head 3"), read from the chart's own spec."""
    chart = next(c for c in at.get("vega_lite_chart") if '"mark": {"type": "rect"}' in c.proto.spec)
    return json.loads(chart.proto.spec)["title"]


def browser_shows(widget, mounted_before: bool):
    """What a browser displays in ``widget``: one it already had shows its own value (AppTest's ``value``); one it
    draws afresh (it was not on the page after the previous run) shows the value the server sent with it
    (``set_value``), else its default. A selectbox's default is an index into its options."""
    if mounted_before or widget.proto.set_value:
        return widget.value
    if widget.type == "selectbox":
        return widget.options[widget.proto.default] if widget.proto.HasField("default") else None
    return type(widget.value)(widget.proto.default[0])


def test_gpt_layer_and_head_controls_show_the_head_the_figure_draws(patched_loader):
    """Issue 28: open a link to layer 1 head 3, clear the prompt (the page stops before drawing the controls), type
    a sentence: the controls drawn afresh showed layer 0 / average of heads while the figure still drew layer 1,
    head 3 (Streamlit kept the values on the server, the browser had forgotten the widgets). After every step, the
    heatmap's title is the head the controls show."""
    at = _page("gpt")
    at.query_params.update({"gpt_layer": "1", "gpt_head": "head 3"})
    at.run()
    assert not at.exception, at.exception

    def agree(mounted_before: bool) -> None:
        layer = browser_shows(at.slider(key="gpt_layer"), mounted_before)
        head = browser_shows(at.selectbox(key="gpt_head"), mounted_before)
        assert head_chart_title(at) == f"layer {layer}, {selection.head_label(head)}", (layer, head)

    agree(mounted_before=False)  # first draw: the link's head
    assert head_chart_title(at) == "layer 1, head 3"
    at.text_area(key="gpt_text").set_value("").run()
    assert any("Type a prompt" in info.value for info in at.info)
    assert not [s for s in at.slider if s.key == "gpt_layer"]  # the page stopped before the controls
    at.text_area(key="gpt_text").set_value("The cat sat on the mat because it was warm.").run()
    assert not at.exception, at.exception
    agree(mounted_before=False)  # drawn afresh after the stopped run
    assert head_chart_title(at) == "layer 1, head 3"  # the chosen head survives the empty prompt
    at.slider(key="gpt_layer").set_value(0).run()
    agree(mounted_before=True)
    assert head_chart_title(at) == "layer 0, head 3"
    at.selectbox(key="gpt_head").set_value("mean").run()
    agree(mounted_before=True)
    assert head_chart_title(at) == "layer 0, average of heads"


def test_grey_cells_are_explained_only_where_something_is_masked(patched_loader):
    """Issue 28: the encoder's heatmap said "Grey cells are masked" under a map where nothing is masked."""
    encoder = _page("encoder").run()
    assert not encoder.exception, encoder.exception
    captions = " ".join(c.value for c in encoder.caption)
    assert "Rows: the token doing the attending" in captions and "Grey cells" not in captions
    gpt = _page("gpt").run()
    assert "Grey cells are masked" in " ".join(c.value for c in gpt.caption)  # the causal mask


def test_sample_button_is_cleared_when_the_text_is_no_longer_the_sample(patched_loader):
    """Issue 28: a sample button stayed highlighted after its text was replaced. A click loads the sample and
    highlights it; typing over it (or uploading a file) clears the highlight, in the browser too (``set_value``)."""
    counting = "one two three four five six seven eight"
    at = _page("gpt").run()
    at.button_group(key="gpt_preset").set_value("Counting").run()
    assert at.text_area(key="gpt_text").value == counting
    assert at.button_group(key="gpt_preset").value == "Counting"
    at.text_area(key="gpt_text").set_value("one two three").run()
    assert not at.exception, at.exception
    pills = at.button_group(key="gpt_preset")
    assert pills.value is None and pills.proto.set_value  # the browser is told to clear it
    assert at.text_area(key="gpt_text").value == "one two three"  # and the typed text stays
    at.button_group(key="gpt_preset").set_value("Counting").run()  # the same sample again loads it again
    assert at.text_area(key="gpt_text").value == counting


def test_a_prompt_too_long_for_a_link_says_so_and_offers_the_text(patched_loader):
    """Issue 28: a link to a pasted 1,500-word prompt silently reopened on the default sentence. The page that has the
    long text says the link will not carry it and offers it as a .txt; the link says a text was left out, and the
    page it opens says so."""
    from app import url_state

    long_text = "word " * 2000  # 10,000 characters, past url_state.MAX_URL_TEXT
    at = _page("gpt")
    at.session_state["gpt_text"] = long_text
    at.run()
    assert not at.exception, at.exception
    assert "gpt_text" not in at.query_params
    assert url_param(at, "gpt_text_omitted") == str(len(long_text))
    notes = " ".join(c.value for c in at.caption)
    assert "too long to travel in a link" in notes
    download = next(b for b in at.download_button if "text" in b.label.lower())
    assert download.proto.label and len(long_text) > url_state.MAX_URL_TEXT

    opened = _page("gpt")
    opened.query_params.update({"gpt_text_omitted": str(len(long_text)), "gpt_layer": "1"})
    opened.run()
    assert not opened.exception, opened.exception
    message = " ".join(i.value for i in opened.info)
    assert "10,000 characters" in message and "upload" in message
    opened.text_area(key="gpt_text").set_value("A text of my own.").run()
    assert not any("10,000 characters" in i.value for i in opened.info)  # gone once the text is replaced
    assert "gpt_text_omitted" not in opened.query_params


def _shown_head(at: AppTest, key: str) -> tuple[int, int | None]:
    choice = at.selectbox(key=f"{key}_head").value
    return at.slider(key=f"{key}_layer").value, None if choice == "mean" else int(choice)


def _maps_of(family: str, text: str):
    from models import families
    from models.core.inputs import TextInput

    loaded = families.load(families.default_spec(family))  # the same tiny model the page was given
    result = families.run(loaded, TextInput(text, 512))
    return result.maps("self"), list(result.tokens)


def _best(scores: np.ndarray) -> tuple[int, int]:
    layer, head = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return int(layer), int(head)


def test_gpt_page_opens_on_the_head_that_teaches_its_sample(patched_loader):
    """Issue 28: the GPT page opened on layer 0 head 0, which shows little. It opens on the head whose attention on
    the sample in view shows the sample's lesson most strongly, and says why: the coreference sample on the head
    where "it" attends most to "animal", the induction sample on its strongest induction head, counting on a
    previous-token head (counted here by hand from the tiny model's maps)."""
    at = _page("gpt").run()
    assert not at.exception, at.exception
    maps, tokens = _maps_of("causal_lm", at.text_area(key="gpt_text").value)
    it, animal = tokens.index("it"), tokens.index("animal")
    scores = np.array([[maps.head(layer, head)[it, animal] for head in range(maps.num_heads)]
                       for layer in range(maps.num_layers)])
    layer, head = _best(scores)
    assert _shown_head(at, "gpt") == (layer, head)
    assert head_chart_title(at) == f"layer {layer}, head {head}"
    assert any(f"Opened on layer {layer}, head {head}" in c.value and "'it'" in c.value for c in at.caption)

    at.button_group(key="gpt_preset").set_value("Induction").run()
    maps, tokens = _maps_of("causal_lm", at.text_area(key="gpt_text").value)
    pairs = [(q, max(p for p in range(q - 1) if tokens[p] == tokens[q]) + 1) for q in range(len(tokens))
             if any(tokens[p] == tokens[q] for p in range(q - 1))]
    pairs = [(q, k) for q, k in pairs if k < q]
    rows, cols = np.array(pairs).T
    scores = np.array([[maps.head(layer, head)[rows, cols].mean() for head in range(maps.num_heads)]
                       for layer in range(maps.num_layers)])
    assert _shown_head(at, "gpt") == _best(scores)
    assert any("induction head" in c.value for c in at.caption)

    at.button_group(key="gpt_preset").set_value("Counting").run()
    maps, tokens = _maps_of("causal_lm", at.text_area(key="gpt_text").value)
    scores = np.array([[np.diagonal(maps.head(layer, head), -1).mean() for head in range(maps.num_heads)]
                       for layer in range(maps.num_layers)])
    assert _shown_head(at, "gpt") == _best(scores)
    at.slider(key="gpt_layer").set_value(0 if _best(scores)[0] else 1).run()  # a head of one's own: no "why" line
    assert not any("Opened on layer" in c.value for c in at.caption)


def test_gpt_page_link_to_a_head_is_not_overridden_by_the_sample(patched_loader):
    at = _page("gpt")
    at.query_params.update({"gpt_layer": "1", "gpt_head": "head 2"})
    at.run()
    assert _shown_head(at, "gpt") == (1, 2)


def test_encoder_page_opens_on_the_head_that_teaches_its_sample(patched_loader):
    """The encoder's coreference sample opens on the head where "it" attends most to "trophy", and says why."""
    at = _page("encoder").run()
    assert not at.exception, at.exception
    maps, tokens = _maps_of("encoder", at.text_area(key="encoder_text").value)
    it, trophy = tokens.index("it"), tokens.index("trophy")
    scores = np.array([[maps.head(layer, head)[it, trophy] for head in range(maps.num_heads)]
                       for layer in range(maps.num_layers)])
    layer, head = _best(scores)
    assert _shown_head(at, "encoder") == (layer, head)
    assert head_chart_title(at) == f"layer {layer}, head {head}"
    assert any(f"Opened on layer {layer}, head {head}" in c.value for c in at.caption)


def focus_bars(at: AppTest) -> np.ndarray:
    """The weights the token-focus bars draw, in key order, read back from the chart's own data."""
    chart = next(c for c in at.get("vega_lite_chart") if '"mark": {"type": "bar"}' in c.proto.spec)
    frame = pa.ipc.open_stream(chart.proto.datasets[0].data.data).read_all().to_pandas()
    return frame.sort_values("position")["weight"].to_numpy()


@pytest.mark.parametrize("combine", ["mean", "sum"])
def test_token_focus_takes_a_span_of_query_tokens_together(patched_loader, combine):
    """Several query tokens at once (a word's pieces, a phrase): the bars are the mean or the sum of their rows."""
    at = _page("gpt").run()
    at.session_state["gpt_view"] = "Token focus"
    at.run()
    assert not at.exception, at.exception
    maps, tokens = _maps_of("causal_lm", at.text_area(key="gpt_text").value)
    layer, head = _shown_head(at, "gpt")
    first, last = 2, 4
    at.select_slider(key="gpt_focus_span").set_range(first, last).run()
    assert not at.exception, at.exception
    at.radio(key="gpt_focus_combine").set_value(combine).run()
    assert not at.exception, at.exception
    rows = maps.head(layer, head)[first:last + 1]
    expected = rows.mean(0) if combine == "mean" else rows.sum(0)
    visible = maps.allowed(layer)[first:last + 1].any(0)
    np.testing.assert_allclose(focus_bars(at), expected[visible], atol=1e-6)
