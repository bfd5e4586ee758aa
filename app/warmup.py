"""Work the server does once, at start, before the first browser connects.

Importing PyTorch and transformers' modelling code takes ~3.5 s on a 2-core machine and loading the default model
~1 s more; until a browser connects the server has nothing else to do. ``start()`` (called from the server's
lifespan hook in app/streamlit_app.py) does both in a background thread, so the first page arrives sooner: on a
server, a visitor who comes later finds everything ready.

Two rules keep this safe:
- Sessions wait for the import phase (``wait_for_imports``) before importing anything heavy themselves: two
  threads importing the same packages at once can see half-initialised modules.
- The preloaded model is handed over once (``claim``) to ``resources.load``, whose cache then owns it; if no
  session asks for it within ``unclaimed_ttl_s`` it is dropped, so an unused copy does not hold memory for good.

This module imports nothing heavy at the top: sessions import it before they wait.
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future
from typing import Callable

from app import server_cpu

_log = logging.getLogger(__name__)


def enabled() -> bool:
    """``ATTN_EXPLORER_WARMUP=0`` turns the warm-up off (e.g. a server that should not hold the default model)."""
    return os.environ.get("ATTN_EXPLORER_WARMUP", "1").strip().lower() not in ("0", "false", "no", "off")


def default_model_key() -> tuple:
    """(spec, device, dtype) that a new session's default page loads: the first language model, the best device."""
    from models import families
    from models.core import loading

    device = loading.available_devices()[0]
    return families.specs("causal_lm")[0], device, loading.available_dtypes(device)[0]


def import_heavy_modules() -> None:
    """What the default page needs that is slow to import: PyTorch, transformers' modelling code (through
    ``capture.register``), every model family, and the figure builders (Altair, pandas). The app's own modules are
    light once these are in; importing them here would make the warm-up depend on the pages it prepares."""
    from models import families  # noqa: F401
    from models.core import capture
    from viz import figures  # noqa: F401

    capture.register()


def load_default(key: tuple):
    """The default model, loaded, after one short forward (the first one allocates and picks kernels: 0.2 s idle,
    0.8 s on a busy machine)."""
    from models import families
    from models.core.inputs import TextInput

    loaded = families.load(*key)
    families.run(loaded, TextInput("Hello", 8))
    return loaded


class WarmUp:
    """One process's warm-up: an import phase that sessions wait for, then one preloaded model to hand over."""

    def __init__(self, import_modules: Callable[[], None] = import_heavy_modules,
                 pick_key: Callable[[], tuple] = default_model_key, load: Callable[[tuple], object] = load_default,
                 unclaimed_ttl_s: float = 600.0):
        self._import_modules, self._pick_key, self._load = import_modules, pick_key, load
        self.unclaimed_ttl_s = unclaimed_ttl_s
        self._imported = threading.Event()
        self._imported.set()  # nothing pending until start() runs
        self._lock = threading.Lock()
        self._started = False
        self._preloaded: dict[tuple, Future] = {}
        self.thread: threading.Thread | None = None

    def start(self) -> bool:
        """Begin in a daemon thread, once; True when this call started it."""
        with self._lock:
            if self._started:
                return False
            self._started = True
            self._imported.clear()
        self.thread = threading.Thread(target=self._run, name="attention-explorer-warm-up", daemon=True)
        self.thread.start()
        return True

    def wait_for_imports(self, timeout_s: float | None = None) -> bool:
        """Block until the import phase is over (at once when none runs); False if ``timeout_s`` passed first."""
        return self._imported.wait(timeout_s)

    def claim(self, key: tuple) -> Future | None:
        """The preloaded model for ``key`` = (spec, device, dtype) as a Future, at most once; else None."""
        with self._lock:
            return self._preloaded.pop(key, None)

    def pending(self) -> list[tuple]:
        """Keys preloaded (or loading) and not yet claimed."""
        with self._lock:
            return list(self._preloaded)

    def _run(self) -> None:
        future: Future | None = None
        try:
            self._import_modules()
            server_cpu.freeze_heap()  # the imports live as long as the server: later full collections skip them
            key = self._pick_key()
            future = Future()
            with self._lock:  # registered before sessions are let in, so none of them starts a second load
                self._preloaded[key] = future
        except Exception:  # the session's own imports raise it again, on its page, with a message
            _log.exception("warm-up imports failed")
        finally:
            self._imported.set()
        if future is None:
            return
        try:
            future.set_result(self._load(key))
        except BaseException as error:  # handed to the claiming session, which shows it like any load failure
            future.set_exception(error)
        timer = threading.Timer(self.unclaimed_ttl_s, self._drop, args=(key, future))
        timer.daemon = True
        timer.start()

    def _drop(self, key: tuple, future: Future) -> None:
        with self._lock:
            if self._preloaded.get(key) is future:
                del self._preloaded[key]


_process = WarmUp()


def start() -> bool:
    """Set the process's allocator up (models/core/memory.py), then start its warm-up unless ``ATTN_EXPLORER_WARMUP=0``;
    True when this call started the warm-up."""
    from models.core import memory

    memory.use_fixed_mmap_threshold()
    return enabled() and _process.start()


def wait_for_imports(timeout_s: float | None = None) -> bool:
    return _process.wait_for_imports(timeout_s)


def claim(key: tuple) -> Future | None:
    return _process.claim(key)
