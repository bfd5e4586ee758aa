"""The server's warm-up: sessions wait for its imports, the preloaded model is handed over once, failures reach the
page as messages, an unclaimed model is dropped, and the server entry point really starts it."""
from __future__ import annotations

import importlib
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from app import warmup
from tests.aio import run_coroutine

ROOT = Path(__file__).resolve().parent.parent
KEY = ("spec", "cpu", "float32")


def gated_warm_up(**kwargs):
    """A WarmUp whose import phase blocks until the test opens the gate."""
    gate = threading.Event()
    loads = []

    def load(key):
        loads.append(key)
        return f"model for {key[0]}"

    return warmup.WarmUp(import_modules=gate.wait, pick_key=lambda: KEY, load=load, **kwargs), gate, loads


def test_without_a_warm_up_sessions_do_not_wait():
    assert warmup.WarmUp().wait_for_imports(0)
    assert warmup.WarmUp().claim(KEY) is None


def test_sessions_wait_for_the_import_phase_then_claim_the_model_once():
    process, gate, loads = gated_warm_up()
    assert process.start()
    assert not process.start()  # once per process
    assert not process.wait_for_imports(0.05)  # still importing: a session must not import torch alongside
    gate.set()
    assert process.wait_for_imports(5)
    preloaded = process.claim(KEY)  # registered before sessions were let in: no session loads it a second time
    assert isinstance(preloaded, Future)
    assert preloaded.result(timeout=5) == "model for spec"
    assert process.claim(KEY) is None  # handed over once; the session's cache owns it now
    assert loads == [KEY]


def test_a_failed_load_reaches_the_session_as_its_error():
    def load(key):
        raise ValueError("'spec' has weights that do not match its config")

    process = warmup.WarmUp(import_modules=lambda: None, pick_key=lambda: KEY, load=load)
    process.start()
    process.thread.join(5)
    with pytest.raises(ValueError, match="do not match"):
        process.claim(KEY).result()


def test_failed_imports_let_sessions_in_and_preload_nothing():
    def broken():
        raise ImportError("no torch")

    process = warmup.WarmUp(import_modules=broken, pick_key=lambda: KEY)
    process.start()
    assert process.wait_for_imports(5)
    process.thread.join(5)
    assert process.pending() == [] and process.claim(KEY) is None


def test_an_unclaimed_model_is_dropped_after_its_ttl():
    process, gate, _ = gated_warm_up(unclaimed_ttl_s=0.2)
    process.start()
    gate.set()
    process.thread.join(5)
    assert process.pending() == [KEY]
    threading.Event().wait(0.6)
    assert process.pending() == []


def test_warm_up_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_WARMUP", "0")
    assert not warmup.enabled()
    assert not warmup.start()
    monkeypatch.setenv("ATTN_EXPLORER_WARMUP", "1")
    assert warmup.enabled()


def test_load_hands_out_the_preloaded_model_without_loading(monkeypatch):
    import streamlit as st

    from app import resources
    from models import families
    key = (families.specs("causal_lm")[0], "cpu", "float32")
    process = warmup.WarmUp(import_modules=lambda: None, pick_key=lambda: key, load=lambda k: "the preloaded model")
    process.start()
    process.thread.join(5)
    monkeypatch.setattr(warmup, "_process", process)
    monkeypatch.setattr(families, "load", lambda *a, **k: pytest.fail("loaded although a preloaded model was there"))
    st.cache_resource.clear()
    try:
        assert resources.load(*key) == "the preloaded model"
        assert resources.load(*key) == "the preloaded model"  # from the cache now: claimed once only
        assert process.pending() == []
    finally:
        st.cache_resource.clear()


def test_the_default_key_is_what_a_new_session_asks_for():
    """The key the server preloads equals the GPT page's first load in a fresh session (else it is never claimed)."""
    from app import sidebar
    from models import families

    spec, device, dtype = warmup.default_model_key()
    assert spec == families.specs("causal_lm")[0]
    assert (device, dtype) == sidebar.device_choice()


def test_the_server_entry_point_starts_the_warm_up_and_serves_the_session_script(monkeypatch):
    """`streamlit run app/streamlit_app.py` finds an st.App that serves app/main.py and whose lifespan starts the
    warm-up once; importing the entry point starts nothing."""
    import streamlit as st
    from streamlit import config
    from streamlit.runtime import Runtime
    from streamlit.web.server.app_discovery import discover_asgi_app

    entry = ROOT / "app" / "streamlit_app.py"
    started = []
    monkeypatch.setattr(warmup, "start", lambda: started.append("started") or True)
    # `streamlit run` sets this before it imports the entry; relative script paths resolve against it
    monkeypatch.setattr(config, "_main_script_path", str(entry))
    monkeypatch.delitem(sys.modules, "app.streamlit_app", raising=False)  # a fresh import, its own st.App
    runtime_existed, threads = Runtime.exists(), set(threading.enumerate())

    module = importlib.import_module("app.streamlit_app")
    assert started == []  # importing starts no warm-up, and no server (earlier tests' TTL timers may start meanwhile)
    new_threads = [t for t in set(threading.enumerate()) - threads if not isinstance(t, threading.Timer)]
    assert Runtime.exists() == runtime_existed and not new_threads, new_threads

    found = discover_asgi_app(entry)  # how `streamlit run` picks the ASGI app out of the file
    assert found.is_asgi_app and found.app_name == "streamlit_app"
    server = module.streamlit_app
    assert isinstance(server, st.App)
    served = (entry.parent / server.script_path).resolve()
    assert served == ROOT / "app" / "main.py" and served.is_file()

    async def serve_once():
        async with server._user_lifespan(server):  # what st.App's own lifespan enters when the server starts
            assert started == ["started"]

    run_coroutine(serve_once(), timeout=30)
    assert started == ["started"]  # exactly once, and not again on shutdown


class _ImportWatch:
    """A meta-path finder that notes, for each watched module imported while it is installed, whether the warm-up's
    import phase was over at that moment; it finds nothing itself (the normal finders import the module)."""

    def __init__(self, names: set[str], phase_over: threading.Event):
        self.names, self.phase_over, self.seen = names, phase_over, {}

    def find_spec(self, name, path=None, target=None):
        if name in self.names and name not in self.seen:
            self.seen[name] = self.phase_over.is_set()
        return None


def test_sessions_wait_for_the_warm_up_imports_before_importing_the_pages(patched_loader, monkeypatch):
    """A session's script (app/main.py) that arrives while the server is still importing PyTorch waits for the import
    phase before it imports the sidebar and the pages, then draws the default page."""
    from streamlit.testing.v1 import AppTest

    process, gate, _ = gated_warm_up(unclaimed_ttl_s=0.1)
    process.start()
    monkeypatch.setattr(warmup, "_process", process)
    watched = {"app.sidebar", "app.catalog"}
    import app

    for name in watched:  # imported afresh by the script: neither in sys.modules nor an attribute of the package
        monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.delattr(app, name.split(".")[1], raising=False)
    watch = _ImportWatch(watched, process._imported)
    monkeypatch.setattr(sys, "meta_path", [watch, *sys.meta_path])
    opener = threading.Timer(1.0, gate.set)
    opener.start()
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=240).run()
    opener.join()
    assert not at.exception, at.exception
    assert watch.seen == {name: True for name in watched}, f"imported before the import phase ended: {watch.seen}"
    assert at.title and "language model" in at.title[0].value.lower()


def test_the_default_model_loads_and_runs_for_real_after_the_warm_up_imports():
    """The real phases on the packaged SmolLM2: what the server does at start, in this process."""
    warmup.import_heavy_modules()
    key = warmup.default_model_key()
    loaded = warmup.load_default(key)
    assert loaded.spec == key[0] and loaded.device == key[1]
