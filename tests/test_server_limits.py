"""Two server-side limits of issue 22: the uploads one session may hold (app/http_guard.CapUploadsPerSession, in
front of Streamlit's upload route), and one free-memory number on the page (the sidebar and the "does not fit"
message both read models/memory_fit.free_bytes)."""
from __future__ import annotations

import pytest

from app import http_guard
from models.core import limits, loading, memory_fit
from tests.aio import run_coroutine

SESSION = "0c8f3e4e-6a7b-4d39-9b8c-1f2e3d4c5b6a"


def _put(guard, path: str, length: int | None = None, method: str = "PUT") -> tuple[list, list]:
    reached, sent = [], []

    async def send(message):
        sent.append(message)

    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "headers": headers}
    run_coroutine(guard(scope, None, send))
    return reached, sent


def _guard(held: tuple[int, int]):
    reached: list = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    return http_guard.CapUploadsPerSession(app, held=lambda session: held), reached


@pytest.fixture
def small_caps(monkeypatch):
    monkeypatch.setattr(limits, "MAX_UPLOAD_BYTES_PER_SESSION", 10 * 2**20)
    monkeypatch.setattr(limits, "MAX_UPLOADS_PER_SESSION", 5)


def test_uploads_under_the_cap_reach_streamlit(small_caps):
    guard, reached = _guard((4, 2 * 2**20))
    _, sent = _put(guard, f"/_stcore/upload_file/{SESSION}/file-1", length=7 * 2**20)
    assert reached == [f"/_stcore/upload_file/{SESSION}/file-1"] and sent == []


@pytest.mark.parametrize("held, length", [((1, 9 * 2**20), 2 * 2**20),  # the new file would pass the byte cap
                                          ((1, 10 * 2**20), None),  # already at the byte cap
                                          ((5, 100), 100)])  # at the file count cap
def test_uploads_over_the_cap_get_413_with_a_message(small_caps, held, length):
    guard, reached = _guard(held)
    _, sent = _put(guard, f"/app/_stcore/upload_file/{SESSION}/file-2", length=length)  # behind a base URL too
    assert reached == []
    assert sent[0]["status"] == 413
    body = sent[1]["body"].decode()
    assert f"holds {held[0]} uploaded files" in body and "Reload the page" in body


def test_other_requests_pass_whatever_the_session_holds(small_caps):
    guard, reached = _guard((1000, 2**40))
    for path, method in ((f"/_stcore/upload_file/{SESSION}/file-1", "DELETE"),  # removing a file always works
                         ("/_stcore/health", "GET"), ("/gpt", "GET"), (f"/_stcore/upload_file/{SESSION}", "PUT")):
        _put(guard, path, method=method)
    assert len(reached) == 4


def test_held_uploads_reads_what_streamlit_keeps_for_the_session(monkeypatch):
    """Streamlit's own file manager (a renamed attribute in a new Streamlit version fails here, not silently)."""
    from streamlit.runtime import Runtime
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
    from streamlit.runtime.uploaded_file_manager import UploadedFileRec

    manager = MemoryUploadedFileManager("/_stcore/upload_file")
    for index, size in enumerate((100, 2500, 7)):
        manager.add_file(SESSION, UploadedFileRec(f"f{index}", f"f{index}.txt", "text/plain", b"x" * size))
    manager.add_file("another-session", UploadedFileRec("g", "g.txt", "text/plain", b"y" * 999))
    monkeypatch.setattr(Runtime, "instance", classmethod(lambda cls: type("R", (), {"uploaded_file_mgr": manager})))
    assert http_guard.held_uploads(SESSION) == (3, 2607)
    assert http_guard.held_uploads("nobody") == (0, 0)
    monkeypatch.setattr(Runtime, "instance", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("none"))))
    assert http_guard.held_uploads(SESSION) == (0, 0)  # no runtime: Streamlit's per-file limit still applies


def test_the_caps_are_set_from_the_environment():
    from tests.test_hostile_input import _limits_in_a_fresh_process

    code, output = _limits_in_a_fresh_process(ATTN_EXPLORER_MAX_UPLOAD_MB_PER_SESSION="30",
                                              ATTN_EXPLORER_MAX_UPLOADS_PER_SESSION="50")
    assert code == 0, output
    summary = eval(output.strip().splitlines()[-1])
    assert summary["MAX_UPLOAD_BYTES_PER_SESSION"] == 30 * 2**20 and summary["MAX_UPLOADS_PER_SESSION"] == 50


def test_the_sidebar_shows_the_free_memory_the_refusal_message_gives(monkeypatch):
    monkeypatch.setattr(memory_fit, "free_bytes", lambda device: int(3.5 * 2**30))
    assert ": 3.5 of " in loading.describe_device("cpu")
    with pytest.raises(ValueError, match="cpu has 3.5 GB free"):
        memory_fit.check("big", 2 * 10**9, "cpu", __import__("torch").float32)
    monkeypatch.setattr(memory_fit, "free_bytes", lambda device: None)
    assert loading.describe_device("cpu").startswith("CPU, ") and "free" not in loading.describe_device("cpu")
