"""The server's per-script-run timing log (app/run_log.py) and the HTTP guard in front of the pages
(app/http_guard.py)."""
from __future__ import annotations

import json
import time

import pytest

from app import http_guard, run_log
from tests.aio import run_coroutine


def test_the_run_log_is_off_unless_a_file_is_named(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTN_EXPLORER_RUN_LOG", raising=False)
    assert run_log.begin() is None
    with run_log.finished(None, "gpt"):
        pass
    run_log.model_loaded("m", False, 1.0)
    assert not list(tmp_path.iterdir())


class StopException(Exception):  # the name Streamlit's st.stop() raises
    pass


def test_each_run_and_load_is_one_json_line(monkeypatch, tmp_path):
    path = tmp_path / "runs.jsonl"
    monkeypatch.setenv("ATTN_EXPLORER_RUN_LOG", str(path))
    started = run_log.begin()
    time.sleep(0.05)
    with run_log.finished(started, "encoder"):
        sum(i * i for i in range(200_000))  # some CPU in this thread
    with pytest.raises(StopException):
        with run_log.finished(run_log.begin(), ""):
            raise StopException
    run_log.model_loaded("SmolLM2 cpu float32", True, 2.5)
    first, second, load = [json.loads(line) for line in path.read_text().splitlines()]
    assert first["event"] == "run" and first["page"] == "encoder" and first["outcome"] == "ok"
    assert first["wall_s"] >= 0.05 and 0 < first["thread_cpu_s"] <= first["wall_s"]
    assert second["outcome"] == "stop"
    assert load == {"event": "load", "t": load["t"], "model": "SmolLM2 cpu float32", "preloaded": True,
                    "seconds": 2.5, "session": ""}


@pytest.mark.parametrize("raw, valid", [(b"/", True), (b"/encoder", True), (b"/caf%C3%A9", True),
                                        (b"/%FF%FE", False), (b"/vit/%C3%28", False), (b"/%80", False)])
def test_paths_that_are_not_utf8_are_refused(raw, valid):
    assert http_guard.valid_path(raw) is valid


def test_the_guard_answers_400_with_a_message_and_passes_the_rest():
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["raw_path"])

    async def send(message):
        sent.append(message)

    guard = http_guard.RefuseUndecodablePaths(app)
    for raw in (b"/%FF", b"/encoder"):
        run_coroutine(guard({"type": "http", "path": raw.decode("latin-1"), "raw_path": raw}, None, send))
    assert reached == [b"/encoder"]
    assert sent[0]["status"] == 400 and b"not valid UTF-8" in sent[1]["body"]
