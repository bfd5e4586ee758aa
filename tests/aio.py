"""Run a coroutine to completion from a test, whatever the calling thread's state.

Sync Playwright (the browser tests run first, from tests/e2e) leaves an event loop running in the main thread, and
``asyncio.run`` refuses to start inside a running loop; a thread of its own has none.
"""
from __future__ import annotations

import asyncio
import concurrent.futures


def run_coroutine(coroutine, timeout: float | None = None):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result(timeout=timeout)
