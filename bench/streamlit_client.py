"""A Streamlit session without a browser: one page load spoken in Streamlit's own websocket protocol.

The load benchmark (bench/case_load.py) drives the real server with headless Chromium, whose renderers share the
machine's two cores with the server: on this machine eight renderers drawing Vega charts leave the server a fraction
of a core, so the server's script times measure the browsers as much as the server. A protocol session does what the
browser's page does on the wire and nothing else: it opens ``/_stcore/stream``, sends the ``rerun_script`` message
the frontend sends on load (the link's query string and the page's URL path), and reads the server's ``ForwardMsg``
protobufs until the script run has finished. It draws nothing, so nearly all of the machine is the server's, and the
server does for it exactly the work it does for a browser: the same script run, the same charts built and
serialised, the same messages sent.

What a view shows is read from those messages: every element the script put in the main area (its text, its
charts' data), an exception or error alert, and whether the run finished.
"""
from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAIN = 0  # the first index of a delta's path: 0 is the page's main area, 1 the sidebar


@dataclass
class ProtocolView:
    """What one page load received: the main area's elements as text, its charts' bytes, and how the run ended."""

    seconds: float = 0.0
    finished: str = ""  # ScriptFinishedStatus name of the last run; "" when it never finished
    texts: list[str] = field(default_factory=list)  # markdown, captions, headings, text boxes, alerts (main area)
    text_boxes: dict[str, str] = field(default_factory=dict)  # label -> value of each text area / text input
    charts: list = field(default_factory=list)  # each chart's message (spec and Arrow data), read when asked
    images: int = 0
    exceptions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # error alerts

    @property
    def drawn(self) -> int:
        return len(self.charts) + self.images

    def words(self) -> set[str]:
        """Lower-case words of the main area's text and of its charts (where a token drawn in a chart sits)."""
        return _words(self.texts) | self.chart_words()

    def chart_words(self) -> set[str]:
        return _words([_chart_texts(chart) for chart in self.charts])


def _words(texts: list[str]) -> set[str]:
    return set(re.findall(r"[a-z]+", "\n".join(texts).lower()))


def _chart_texts(chart) -> str:
    """A chart's spec and each string cell of its data tables (Arrow IPC streams), one per line: the raw buffers
    run strings together ("theapple"), which would hide a token from a word search."""
    import pyarrow as pa

    texts = [chart.spec]
    for table_bytes in [chart.data.data, *(named.data.data for named in chart.datasets)]:
        if not table_bytes:
            continue
        table = pa.ipc.open_stream(table_bytes).read_all()
        for column in table.columns:
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                texts.extend(value for value in column.to_pylist() if value)
    return "\n".join(texts)


def _stream_url(page_url: str) -> tuple[str, str, str]:
    """(websocket URL, page name, query string) of a link such as ``http://host:port/encoder?encoder_text=...``."""
    parts = urlsplit(page_url)
    return f"ws://{parts.netloc}/_stcore/stream", parts.path.strip("/"), parts.query


def _read(view: ProtocolView, message) -> None:
    if message.WhichOneof("type") != "delta":
        return
    path = list(message.metadata.delta_path)
    if not path or path[0] != MAIN or message.delta.WhichOneof("type") != "new_element":
        return
    element = message.delta.new_element
    kind = element.WhichOneof("type")
    if kind == "markdown":
        view.texts.append(element.markdown.body)
    elif kind == "heading":
        view.texts.append(element.heading.body)
    elif kind == "text":
        view.texts.append(element.text.body)
    elif kind in ("text_area", "text_input"):
        box = getattr(element, kind)
        value = box.value if box.HasField("value") else box.default
        view.text_boxes[box.label] = value
        view.texts.append(value)
    elif kind == "alert":
        view.texts.append(element.alert.body)
        if element.alert.format == element.alert.ERROR:
            view.errors.append(element.alert.body)
    elif kind == "exception":
        view.exceptions.append(f"{element.exception.type}: {element.exception.message}")
    elif kind == "vega_lite_chart":
        view.charts.append(element.vega_lite_chart)  # decoded by the checks, after the run: no client work meanwhile
    elif kind == "imgs":
        view.images += len(element.imgs.imgs)


async def open_view(page_url: str, timeout_s: float = 300.0) -> ProtocolView:
    """Load ``page_url`` as a new session and wait until its script run has finished (a run that ends early for a
    rerun is followed by the rerun); raises ``TimeoutError`` when it has not within ``timeout_s``."""
    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    url, page_name, query = _stream_url(page_url)
    view = ProtocolView()
    start = time.perf_counter()
    request = BackMsg()
    request.rerun_script.query_string = query
    request.rerun_script.page_name = page_name
    async with asyncio.timeout(timeout_s):
        async with websockets.connect(url, subprotocols=["streamlit"], max_size=None) as socket:
            await socket.send(request.SerializeToString())
            while True:
                message = ForwardMsg()
                message.ParseFromString(await socket.recv())
                if message.WhichOneof("type") == "script_finished":
                    view.finished = ForwardMsg.ScriptFinishedStatus.Name(message.script_finished)
                    if message.script_finished != ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                        break
                    view.texts, view.text_boxes, view.charts, view.images = [], {}, [], 0  # the rerun redraws
                    continue
                _read(view, message)
    view.seconds = time.perf_counter() - start
    return view
