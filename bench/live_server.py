"""The real server, started as the README does (``streamlit run app/streamlit_app.py``) on a loopback port, for the
load benchmark (bench/case_load.py) and the tests that attack it (tests/e2e/test_server_faults.py).

``LiveServer`` knows the server's pid, so callers can read its memory and CPU time from outside (psutil), and can
switch on the per-script-run timing log (``ATTN_EXPLORER_RUN_LOG``, written by app/run_log.py).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveServer:
    """A running ``streamlit run`` process on 127.0.0.1; ``stop()`` ends it (and only it)."""

    process: subprocess.Popen
    url: str
    log_path: Path
    run_log: Path | None = None
    samples: list = field(default_factory=list)  # (seconds since start, rss bytes, cpu seconds)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def healthy(self, timeout_s: float = 5) -> bool:
        try:
            return urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=timeout_s).status == 200
        except OSError:
            return False

    def usage(self) -> tuple[int, float]:
        """(resident memory in bytes, CPU seconds user + system so far) of the server process."""
        import psutil

        process = psutil.Process(self.pid)
        times = process.cpu_times()
        return process.memory_info().rss, times.user + times.system

    def sample(self, since: float) -> tuple[float, int, float]:
        rss, cpu = self.usage()
        self.samples.append((time.perf_counter() - since, rss, cpu))
        return self.samples[-1]

    def runs(self) -> list[dict]:
        """The script runs the server logged (one JSON object per line), when the run log is on."""
        if self.run_log is None or not self.run_log.exists():
            return []
        return [json.loads(line) for line in self.run_log.read_text().splitlines() if line.strip()]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start(port: int | None = None, env: dict | None = None, log_path: Path | None = None,
          run_log: Path | None = None, nice: int = 0, timeout_s: float = 120) -> LiveServer:
    """``streamlit run app/streamlit_app.py`` offline on 127.0.0.1:``port`` (a free one by default), once its health
    check answers. ``run_log``: switch on the per-script-run timing log, written there."""
    port = port or free_port()
    log_path = log_path or ROOT / "artifacts" / f"live-server-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       STREAMLIT_BROWSER_GATHER_USAGE_STATS="false", **(env or {}))
    if run_log is not None:
        run_log.unlink(missing_ok=True)
        environment["ATTN_EXPLORER_RUN_LOG"] = str(run_log)
    command = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "streamlit_app.py"),
               "--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1",
               "--browser.gatherUsageStats", "false"]
    with open(log_path, "w") as log:
        process = subprocess.Popen((["nice", "-n", str(nice)] if nice else []) + command, cwd=ROOT,
                                   env=environment, stdout=log, stderr=subprocess.STDOUT)
    server = LiveServer(process, f"http://127.0.0.1:{port}", log_path, run_log)
    deadline = time.time() + timeout_s
    while not server.healthy(timeout_s=2):
        if not server.alive() or time.time() > deadline:
            server.stop()
            raise RuntimeError(f"the server did not start within {timeout_s:.0f} s: {server.log_text()[-2000:]}")
        time.sleep(0.3)
    return server
