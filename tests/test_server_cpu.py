"""app/server_cpu.py and the server settings that keep a view's CPU for the page's own work (issue 22's profile)."""
from __future__ import annotations

import gc
import tomllib
import weakref

from app import server_cpu
from tests.conftest import ROOT


class Node:
    pass


def test_freeze_heap_takes_live_objects_out_of_later_collections_and_refcounting_still_frees_them():
    kept = [Node() for _ in range(20_000)]
    short_lived = Node()
    gone = weakref.ref(short_lived)
    try:
        frozen = server_cpu.freeze_heap()
        assert frozen >= 20_000 and gc.get_freeze_count() >= 20_000
        tracked = {id(obj) for obj in gc.get_objects()}
        assert not any(id(node) in tracked for node in kept[::1000])  # the collector no longer walks them
        del short_lived
        assert gone() is None  # freed by its reference count, frozen or not
        cycle = Node()
        cycle.me = cycle  # garbage made after the freeze is still collected
        cycle_ref = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert cycle_ref() is None
    finally:
        gc.unfreeze()


def test_openmp_threads_sleep_unless_the_user_said_otherwise(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    server_cpu.quiet_openmp()
    assert __import__("os").environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    server_cpu.quiet_openmp()
    assert __import__("os").environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_server_runs_without_a_file_watcher_and_keeps_its_per_run_collection():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none"
    assert config.get("runner", {}).get("postScriptGC", True) is True  # cheap now, and still frees the page's garbage
