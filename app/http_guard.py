"""ASGI middleware in front of Streamlit's own routes (app/streamlit_app.py): refuse request paths the page could never
show, with a plain-text 400 that says why; and cap what one session may hold in uploads.

A link whose path holds percent-escapes that are not UTF-8 (``/%FF%FE``) is served Streamlit's page, whose router then
fails to decode it and never connects: the visitor sees the loading skeleton forever, with no message. The query
string needs nothing: the page decodes invalid UTF-8 there to U+FFFD, and the app's link parsing refuses bad values.

Streamlit keeps every file PUT to ``/_stcore/upload_file/<session>/<file>`` in memory until that session ends (its
own limit, ``server.maxUploadSize``, is per file): one visitor PUTting 25 MB files in a loop would hold 25 MB more
each time. ``CapUploadsPerSession`` answers 413 once a session holds ``limits.MAX_UPLOAD_BYTES_PER_SESSION`` bytes or
``limits.MAX_UPLOADS_PER_SESSION`` files; the uploader shows the status, and reloading the page (a new session)
starts afresh. A file the page stops using is dropped by the uploader itself (its DELETE), so a user who swaps
files now and then never meets the cap.
"""
from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from models.core import limits

MESSAGE = b"Bad Request: this address is not valid UTF-8. Open the app's home page (/) instead.\n"


def valid_path(raw_path: bytes) -> bool:
    """Whether ``raw_path`` (as sent, percent-escaped) decodes to UTF-8."""
    try:
        unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def plain_text(send, status: int, body: bytes) -> None:
    """An HTTP answer of ``status`` whose body is ``body`` as plain UTF-8 text."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class RefuseUndecodablePaths:
    """Answer 400 to an HTTP request whose path is not UTF-8 once unescaped; pass everything else through."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not valid_path(scope.get("raw_path") or scope["path"].encode()):
            await plain_text(send, 400, MESSAGE)
            return
        await self.app(scope, receive, send)


UPLOAD_PATH = re.compile(r"/_stcore/upload_file/([^/]+)/[^/]+$")
UPLOAD_MESSAGE = ("Payload Too Large: this page already holds {files} uploaded files ({megabytes:,.0f} MB), the most "
                  "one visitor may keep at once. Reload the page to start afresh.\n")


def held_uploads(session_id: str) -> tuple[int, int]:
    """(files, bytes) Streamlit holds for ``session_id``'s uploads; (0, 0) when it cannot be told."""
    try:
        from streamlit.runtime import Runtime

        manager = Runtime.instance().uploaded_file_mgr
        with manager._lock:
            files = list(manager.file_storage.get(session_id, {}).values())
        return len(files), sum(len(file.data) for file in files)
    except Exception:  # another file manager, no runtime: Streamlit's own limits still apply
        return 0, 0


class CapUploadsPerSession:
    """Answer 413 to an upload into a session that already holds the most files or bytes one session may; pass
    everything else through. ``held`` tells (files, bytes) held for a session id (Streamlit's file manager)."""

    def __init__(self, app, held=held_uploads):
        self.app, self.held = app, held

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "PUT" and \
                (match := UPLOAD_PATH.search(scope.get("path", ""))) is not None:
            files, held = self.held(match.group(1))
            incoming = next((int(value) for name, value in scope.get("headers", [])
                             if name.lower() == b"content-length" and value.isdigit()), 0)
            cap = limits.MAX_UPLOAD_BYTES_PER_SESSION
            if files >= limits.MAX_UPLOADS_PER_SESSION or held >= cap or held + incoming > cap:
                await plain_text(send, 413, UPLOAD_MESSAGE.format(files=files, megabytes=held / 2**20).encode())
                return
        await self.app(scope, receive, send)
