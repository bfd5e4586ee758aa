"""Hostile visitors against the real server (``streamlit run``, loopback only), over HTTP and in Chromium.

Each case gets a message (an HTTP status, or an alert on the page), never a traceback; nothing typed becomes HTML; no
file outside the allowed model folder is read (checked by the access times of a valid model placed just outside it,
reached through ``..`` and through a symlink); and the server keeps serving: its health check answers and a new
visitor's page renders its charts.

The server runs with a token limit of 64 (so each run is cheap) and one allowed model folder holding a tiny model, the config of a 70 B Llama (no weights: it must
be refused from its size alone), and a symlink that points out of the folder.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from bench import live_server
from models import families
from tests import tiny_text_models
from tests.e2e.conftest import (
    MARKUP,
    assert_healthy,
    assert_nothing_injected,
    charts_visible,
    screenshot,
    wait_until_idle,
)
from tests.e2e.test_hostile import alert_text, choose_model, submit_text, wait_for_alert

HUGE_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
              "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}
OTHER = "Other: a hub id or a local folder…"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("server_hostile")
    allowed, outside = base / "allowed", base / "outside"
    tiny_text_models.save_tiny_causal_lm(allowed / "tiny-lm")
    (allowed / "llama-70b").mkdir(parents=True)
    (allowed / "llama-70b" / "config.json").write_text(json.dumps(HUGE_LLAMA))
    secret = tiny_text_models.save_tiny_causal_lm(outside / "secret-lm")  # loads fine, if anything ever reads it
    (allowed / "escape").symlink_to(secret, target_is_directory=True)
    return {"allowed": allowed, "outside": outside, "secret": secret}


@pytest.fixture(scope="module")
def server(folders):
    started = live_server.start(env={"ATTN_EXPLORER_MODEL_DIRS": str(folders["allowed"]),
                                     "ATTN_EXPLORER_MAX_TOKENS": "64"},  # every case's run stays cheap
                                log_path=live_server.ROOT / "artifacts" / "e2e-server-hostile.log")
    yield started
    started.stop()


def reset_access_times(folder: Path) -> None:
    """Access times far in the past: any read of these files moves them (relatime updates an atime older than the
    file's mtime)."""
    for path in folder.rglob("*"):
        if path.is_file():
            os.utime(path, (0, path.stat().st_mtime))


def read_since_reset(folder: Path) -> list[str]:
    return [str(path) for path in folder.rglob("*") if path.is_file() and path.stat().st_atime > 0]


def raw_request(server, request: bytes) -> bytes:
    """Bytes sent as they are (a browser would escape them), the whole answer back."""
    port = int(server.url.rsplit(":", 1)[1])
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as connection:
        connection.sendall(request)
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def new_visitor_sees_charts(browser, server) -> None:
    """A second browser arriving now gets a working page (the server keeps serving everyone else)."""
    context = browser.new_context(viewport={"width": 1400, "height": 2000})
    try:
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(f"{server.url}/encoder?encoder_text=The+cat+sat+on+the+mat.")
        wait_until_idle(page, 240)
        assert_healthy(page)
        assert charts_visible(page) >= 2
    finally:
        context.close()


def open_gpt(page, server, query: str = "") -> None:
    page.goto(f"{server.url}/{query}")
    wait_until_idle(page, 300)


# --- URLs -----------------------------------------------------------------------------------------------------------

def test_raw_requests_with_bad_bytes_get_an_http_answer(server):
    """Invalid UTF-8 and path tricks in the request line: a 400 or the page, no traceback, and the server serves."""
    cases = {
        b"GET /\xff\xfe?x=\xc3\x28 HTTP/1.1": 400,  # raw non-UTF-8 bytes in the path
        b"GET /?gpt_text=%FF%FE%C3%28 HTTP/1.1": 200,  # escaped invalid UTF-8: the page, the app decodes it later
        b"GET /%FF%FE HTTP/1.1": 400,  # app/http_guard.py: the page could never decode it
        b"GET /vit/%C3%28 HTTP/1.1": 400,
        b"GET /%FF%FE%00 HTTP/1.1": 400,
        b"GET /encoder/%E2%82%AC HTTP/1.1": 200,  # valid UTF-8 (a euro sign): the page
        b"GET /../../../../etc/passwd HTTP/1.1": 400,
        b"GET /static/..%2f..%2f..%2f..%2fetc%2fpasswd HTTP/1.1": 400,
        b"GET /?" + b"q=" + b"a" * 100_000 + b" HTTP/1.1": 200,
    }
    for line, expected in cases.items():
        answer = raw_request(server, line + b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert status_of(answer) == expected, (line[:60], answer[:200])
        assert b"Traceback" not in answer and b"root:" not in answer
        assert server.healthy()
    assert "Traceback" not in server.log_text()


def test_100kb_query_string_and_invalid_utf8_in_the_link_give_a_page(watched, browser, server):
    page = watched
    words = ("the cat sat on the mat " * 5000)[:100_000]
    junk = "%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E" * 500
    open_gpt(page, server, f"?gpt_text={words.replace(' ', '+')}&gpt_layer=999999999999&junk={junk}")
    assert_healthy(page)
    assert_nothing_injected(page)
    assert "only the first" in alert_text(page)  # the text is cut to the token limit, with a notice
    assert charts_visible(page) >= 2
    link = parse_qs(urlparse(page.url).query)
    assert "gpt_text" not in link  # the page took the text out of its link (links hold at most 1,500 characters)
    assert link["gpt_text_omitted"] == ["100000"]  # and says so: the page it opens tells its visitor
    assert 0 <= int(link["gpt_layer"][0]) < 30  # the impossible layer was refused: the page's own choice is shown

    open_gpt(page, server, "?gpt_text=%FF%FEcat%C3%28sat%80on%20the%20mat&gpt_head=%FF")
    assert_healthy(page)
    assert page.get_by_role("textbox", name="Prompt", exact=True).input_value() == "\ufffd\ufffdcat\ufffd(sat\ufffdon the mat"
    assert charts_visible(page) >= 2

    answer = page.goto(f"{server.url}/%FF%FE")  # a path that is not UTF-8: the page would never start (a skeleton)
    assert answer.status == 400 and "not valid UTF-8" in page.inner_text("body")
    answer = page.goto(f"{server.url}/%00")  # a NUL byte in the path: refused by Streamlit
    assert answer.status == 400 and page.inner_text("body").strip() == "Bad Request"
    open_gpt(page, server, "no-such-page?x=%00%FF")  # a page that does not exist, NUL and 0xFF in the query
    assert_healthy(page)
    assert charts_visible(page) >= 2
    new_visitor_sees_charts(browser, server)


def test_ten_megabyte_prompt_is_cut_with_a_notice(watched, browser, server):
    page = watched
    open_gpt(page, server)
    submit_text(page, "Prompt", "the cat sat on the mat. " * (10 * 2**20 // 24))  # 10 MB in one websocket message
    assert_healthy(page)
    assert "only the first" in alert_text(page)
    assert charts_visible(page) >= 2
    screenshot(page, "server-hostile-10mb-prompt")
    submit_text(page, "Prompt", "The capital of France is")
    assert "only the first" not in alert_text(page)
    assert charts_visible(page) >= 2
    new_visitor_sees_charts(browser, server)


# --- uploads --------------------------------------------------------------------------------------------------------

def test_upload_over_the_limit_and_2000_tiny_uploads(watched, browser, server):
    """The upload endpoint itself (what the uploader sends): 26 MB is refused with 413 before it is stored; 2,000
    tiny files in a row are taken without the server's memory growing more than a few MB; the page still works."""
    page = watched
    open_gpt(page, server)
    with page.expect_request(lambda request: "/_stcore/upload_file/" in request.url
                             and request.method == "PUT") as captured:
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
            {"name": "first.txt", "mimeType": "text/plain", "buffer": b"The first upload works."})
    wait_until_idle(page)
    assert page.get_by_role("textbox", name="Prompt", exact=True).input_value() == "The first upload works."
    request = captured.value
    endpoint = request.url.rsplit("/", 1)[0]  # /_stcore/upload_file/<session>
    token = request.headers.get("x-xsrftoken", "")
    put = """async ({endpoint, token, count, size, name}) => {
        const statuses = {};
        for (let i = 0; i < count; i++) {
            const form = new FormData();
            form.append("file", new Blob([new Uint8Array(size).fill(97)], {type: "text/plain"}), `${name}-${i}.txt`);
            const answer = await fetch(`${endpoint}/${name}-${i}-${Date.now()}`,
                                       {method: "PUT", body: form, headers: {"X-Xsrftoken": token}});
            statuses[answer.status] = (statuses[answer.status] || 0) + 1;
        }
        return statuses;
    }"""
    too_big = page.evaluate(put, {"endpoint": endpoint, "token": token, "count": 1, "size": 26 * 2**20,
                                  "name": "huge"})
    assert too_big == {"413": 1}, too_big
    before, _ = server.usage()
    start = time.perf_counter()
    tiny = page.evaluate(put, {"endpoint": endpoint, "token": token, "count": 2000, "size": 100, "name": "tiny"})
    took = time.perf_counter() - start
    after, _ = server.usage()
    assert tiny == {"204": 2000} or tiny == {"200": 2000}, tiny
    assert after - before < 64 * 2**20, f"the server grew {(after - before) / 2**20:.0f} MB over 2,000 tiny uploads"
    assert took < 300
    forged = page.evaluate(put, {"endpoint": endpoint, "token": "forged", "count": 1, "size": 10, "name": "forged"})
    assert forged == {"403": 1}, forged  # XSRF protection is on

    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        {"name": "second.txt", "mimeType": "text/plain", "buffer": b"The second upload works too."})
    wait_until_idle(page)
    assert_healthy(page)
    assert page.get_by_role("textbox", name="Prompt", exact=True).input_value() == "The second upload works too."
    assert charts_visible(page) >= 2
    print(f"\n2,000 tiny uploads: {took:.1f} s, server memory {before / 2**20:.0f} -> {after / 2**20:.0f} MB")
    new_visitor_sees_charts(browser, server)


# --- model ids and folders --------------------------------------------------------------------------------------------

def type_model(page, typed: str) -> str:
    box = page.get_by_label("Hub id or local folder")
    box.fill(typed)
    box.press("Enter")
    wait_until_idle(page)
    return alert_text(page)


def test_folders_outside_the_allowed_root_and_hub_ids_with_path_tricks(watched, browser, server, folders):
    allowed, outside, secret = folders["allowed"], folders["outside"], folders["secret"]
    cases = [  # (typed, what the alert must say)
        (f"{allowed}/../outside/secret-lm", "outside the folders"),
        (f"{allowed}/escape", "outside the folders"),  # a symlink in the allowed folder pointing out of it
        (f"{allowed}/escape/../../outside/secret-lm", "outside the folders"),
        ("../../../../../../../" + str(secret).lstrip("/"), "outside the folders"),
        ("~/../../" + str(secret).lstrip("/"), "outside the folders"),
        (f"local-dir:{secret}", "outside the folders"),
        ("/etc", "outside the folders"),
        ("gpt2/../../../etc", "outside the folders"),  # hub ids with path tricks
        ("openai-community/gpt2/../../..", "outside the folders"),
        ("owner\\..\\..\\etc", "outside the folders"),
        ("hf-hub:../../etc", "outside the folders"),
        ("%2e%2e/%2e%2e/etc/passwd", "Could not load"),
        ("file:///etc/passwd", "Could not load"),
        (f"owner/{MARKUP}", "Could not load"),
    ]
    page = watched
    reset_access_times(outside)
    open_gpt(page, server)
    choose_model(page, OTHER)
    for typed, says in cases:
        shown = type_model(page, typed)
        if says not in shown:
            shown = wait_for_alert(page, says)
        assert says in shown, (typed, shown)
        assert_healthy(page)
        assert_nothing_injected(page)
        assert charts_visible(page, settle_s=0.5) == 0, typed  # nothing loaded
        assert not read_since_reset(outside), (typed, read_since_reset(outside))
        assert server.healthy()
    screenshot(page, "server-hostile-symlink")
    type_model(page, str(allowed / "tiny-lm"))  # the allowed folder itself works
    assert_healthy(page)
    assert charts_visible(page) >= 2
    assert not read_since_reset(outside)
    new_visitor_sees_charts(browser, server)


def test_a_model_too_large_for_the_memory_is_refused_and_everyone_else_is_served(watched, browser, server, folders):
    page = watched
    open_gpt(page, server)
    choose_model(page, OTHER)
    start = time.perf_counter()
    shown = type_model(page, str(folders["allowed"] / "llama-70b"))
    assert "does not fit in memory" in shown and "70.55 billion parameters" in shown and "GB free" in shown, shown
    assert time.perf_counter() - start < 60
    assert_healthy(page)
    screenshot(page, "server-hostile-too-large")
    new_visitor_sees_charts(browser, server)  # another visitor, meanwhile
    choose_model(page, families.default_spec("causal_lm").label)  # and this one, back on a listed model
    assert_healthy(page)
    assert charts_visible(page) >= 2
    assert server.alive() and "Traceback" not in server.log_text()
