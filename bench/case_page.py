"""``view_bytes`` and ``rerender`` cases: the GPT page in Streamlit's ``AppTest`` at n = 1024 tokens.

The page runs on the app's default offline model. ``Traffic`` sums every ForwardMsg the server enqueues
(protobuf ``ByteSize``) plus every media file it stores (the PNG heatmaps): that is what goes to the browser.

- ``view_bytes``: the larger of one head view and the all-heads grid; target ≤ 2 MiB.
- ``rerender``: wall (and CPU) seconds of head, layer and zoom changes and the grid tab, without re-running the
  model; baseline: the same page after a new 1024-token prompt (model re-run); target ≤ 200 ms.

Both come from one run of the page, in a fresh process.
"""
from __future__ import annotations

import os
import time

from bench import ROOT
from bench.measure import MB
from bench.worker import worker

TARGETS = {"view_bytes": {"bytes": 2 * MB}, "rerender": {"ours_s": 0.2}}


def long_text(tokens_wanted: int, seed: int) -> str:
    """English-like text of roughly ``tokens_wanted`` tokens or more: sentences drawn from the GPT page's samples."""
    import numpy as np

    sentences = ["The animal didn't cross the street because it was too tired.",
                 "Mr and Mrs Dursley of number four, Privet Drive, were proud to say that they were perfectly normal.",
                 "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
                 "one two three four five six seven eight nine ten", "The capital of France is Paris."]
    rng = np.random.default_rng(seed)
    return " ".join(sentences[i] for i in rng.integers(0, len(sentences), tokens_wanted // 8 + 20))


class Traffic:
    """Counts what the server would send: every ForwardMsg enqueued (protobuf bytes) and every media file stored."""

    def __init__(self):
        from streamlit.runtime.forward_msg_queue import ForwardMsgQueue
        from streamlit.runtime.media_file_manager import MediaFileManager

        self.messages = self.media = 0
        traffic = self
        enqueue, add = ForwardMsgQueue.enqueue, MediaFileManager.add

        def counting_enqueue(queue, msg):
            traffic.messages += msg.ByteSize()
            return enqueue(queue, msg)

        def counting_add(manager, path_or_data, *args, **kwargs):
            if isinstance(path_or_data, bytes):
                traffic.media += len(path_or_data)
            return add(manager, path_or_data, *args, **kwargs)

        ForwardMsgQueue.enqueue, MediaFileManager.add = counting_enqueue, counting_add

    def run(self, at) -> tuple[float, int]:
        """(wall seconds, bytes) of one script run; ``self.cpu_s`` is the CPU time the process spent on it, which
        the other users of a shared machine do not inflate the way they inflate wall time."""
        self.messages = self.media = 0
        start, cpu = time.perf_counter(), time.process_time()
        at.run()
        seconds, self.cpu_s = time.perf_counter() - start, time.process_time() - cpu
        if at.exception:
            raise RuntimeError(f"the page failed: {at.exception[0].value}")
        return seconds, self.messages + self.media


def task_page(job: dict) -> dict:
    """The GPT page at ``n`` tokens in AppTest: a cold run, a new prompt, head and layer changes, the grid tab."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from streamlit.testing.v1 import AppTest

    n = job["n"]
    traffic = Traffic()
    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=3600)
    at.session_state["max_tokens"] = n
    at.session_state["gpt_text"] = long_text(n, seed=0)
    out = {}
    out["cold_s"], out["cold_bytes"] = traffic.run(at)  # model load + forward + first view
    tokens = next(c.value for c in at.caption if "tokens ·" in c.value)
    out["page_caption"] = tokens
    at.text_area(key="gpt_text").set_value(long_text(n, seed=1))
    out["new_prompt_s"], out["new_prompt_bytes"] = traffic.run(at)  # the model re-run: the rerender baseline
    at.selectbox(key="gpt_head").set_value("head 3")
    out["head_s"], out["head_bytes"] = traffic.run(at)
    out["head_cpu_s"] = traffic.cpu_s
    at.slider(key="gpt_layer").set_value(5)
    out["layer_s"], out["layer_bytes"] = traffic.run(at)
    out["layer_cpu_s"] = traffic.cpu_s
    at.slider(key="gpt_zoom_q").set_value((500, 563))
    out["zoom_s"], out["zoom_bytes"] = traffic.run(at)
    out["zoom_cpu_s"] = traffic.cpu_s
    out["same_s"], _ = traffic.run(at)  # nothing changed: the floor of a rerun
    out["same_cpu_s"] = traffic.cpu_s
    at.session_state["gpt_view"] = "All heads (model view)"
    out["grid_first_s"], out["grid_bytes"] = traffic.run(at)  # computes the all-heads summary once
    at.selectbox(key="gpt_head").set_value("head 1")
    out["grid_head_s"], out["grid_head_bytes"] = traffic.run(at)
    out["grid_head_cpu_s"] = traffic.cpu_s
    at.slider(key="gpt_layer").set_value(2)
    out["grid_layer_s"], out["grid_layer_bytes"] = traffic.run(at)
    out["grid_layer_cpu_s"] = traffic.cpu_s
    return out


def case_page(n: int, threads: int, cases: list[str]) -> list[dict]:
    page = worker({"task": "page", "n": n, "threads": threads, "device": "cpu"})
    rows = []
    one_head = max(page["head_bytes"], page["layer_bytes"])
    grid = max(page["grid_bytes"], page["grid_head_bytes"], page["grid_layer_bytes"])
    if "view_bytes" in cases:
        rows.append({"case": "view_bytes", "n": n, "ours_s": None, "baseline_s": None, "ratio": None,
                     "extra_mb": None, "bytes": max(one_head, grid), "one_head_bytes": one_head, "grid_bytes": grid,
                     "cold_run_bytes": page["cold_bytes"], "page": page["page_caption"],
                     "target": "bytes <= 2 MiB", "ok": max(one_head, grid) <= TARGETS["view_bytes"]["bytes"]})
    if "rerender" in cases:
        moves = ("head", "layer", "zoom", "grid_head", "grid_layer")
        ours_s = max(page[f"{m}_s"] for m in moves)
        rows.append({"case": "rerender", "n": n, "ours_s": ours_s, "baseline_s": page["new_prompt_s"],
                     "ratio": ours_s / page["new_prompt_s"], "extra_mb": None, "bytes": one_head,
                     "ours_cpu_s": max(page[f"{m}_cpu_s"] for m in moves),
                     **{k: v for k, v in page.items() if k.endswith("_s")},
                     "page": page["page_caption"], "baseline": "same page after a new prompt (model re-run)",
                     "target": "ours_s <= 0.2", "ok": ours_s <= TARGETS["rerender"]["ours_s"]})
    return rows
