"""ASGI middleware in front of Streamlit's own routes (app/streamlit_app.py): refuse request paths the page could never
show, with a plain-text 400 that says why.

A link whose path holds percent-escapes that are not UTF-8 (``/%FF%FE``) is served Streamlit's page, whose router then
fails to decode it and never connects: the visitor sees the loading skeleton forever, with no message. The query
string needs nothing: the page decodes invalid UTF-8 there to U+FFFD, and the app's link parsing refuses bad values.
"""
from __future__ import annotations

from urllib.parse import unquote_to_bytes

MESSAGE = b"Bad Request: this address is not valid UTF-8. Open the app's home page (/) instead.\n"


def valid_path(raw_path: bytes) -> bool:
    """Whether ``raw_path`` (as sent, percent-escaped) decodes to UTF-8."""
    try:
        unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class RefuseUndecodablePaths:
    """Answer 400 to an HTTP request whose path is not UTF-8 once unescaped; pass everything else through."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not valid_path(scope.get("raw_path") or scope["path"].encode()):
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(MESSAGE)).encode())]})
            await send({"type": "http.response.body", "body": MESSAGE})
            return
        await self.app(scope, receive, send)
