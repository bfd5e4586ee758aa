"""Server-side timing of every script run, off unless ``ATTN_EXPLORER_RUN_LOG`` names a file (the load benchmark,
bench/case_load.py, switches it on).

One JSON line per script run: the page, the session, its wall time and the CPU time of the thread that ran it (the
script's own thread: a browser's rendering on the same machine is not in it), and how it ended (``ok``, ``stop`` for
``st.stop()``, ``rerun``, or the exception's type). One line per model actually loaded (``event: load``), so a test
can count that simultaneous first visits loaded a model once. Off, each call is one dictionary lookup.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time

_lock = threading.Lock()


def _path() -> str | None:
    return os.environ.get("ATTN_EXPLORER_RUN_LOG") or None


def _write(record: dict) -> None:
    path = _path()
    if path is None:
        return
    with _lock, open(path, "a") as file:
        file.write(json.dumps(record) + "\n")


def _session_id() -> str:
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else ""


def begin() -> tuple[float, float, float] | None:
    """The start of a script run (wall clock, monotonic, thread CPU), or None when the log is off."""
    return (time.time(), time.perf_counter(), time.thread_time()) if _path() else None


@contextlib.contextmanager
def finished(started: tuple[float, float, float] | None, page: str):
    """Log the run begun at ``started`` when the block exits, however it exits."""
    if started is None:
        yield
        return
    outcome = "ok"
    try:
        yield
    except BaseException as error:
        name = type(error).__name__
        outcome = {"StopException": "stop", "RerunException": "rerun"}.get(name, name)
        raise
    finally:
        _write({"event": "run", "t": started[0], "page": page, "session": _session_id(),
                "wall_s": round(time.perf_counter() - started[1], 4),
                "thread_cpu_s": round(time.thread_time() - started[2], 4), "outcome": outcome})


def model_loaded(key: str, preloaded: bool, seconds: float) -> None:
    """A model was loaded into the cache (``preloaded``: handed over by the server's warm-up)."""
    _write({"event": "load", "t": time.time(), "model": key, "preloaded": preloaded, "seconds": round(seconds, 3),
            "session": _session_id()})
