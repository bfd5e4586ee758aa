"""Server entry point: ``streamlit run app/streamlit_app.py``.

An ASGI ``st.App`` serving app/main.py (the script each browser session runs), with a lifespan hook that starts the
warm-up (app/warmup.py): PyTorch, transformers and the default model load while the first browser is still
fetching the page, instead of after it connects; and guards (app/http_guard.py) that answer paths the page could
never decode with a message and cap the uploads one session holds.
"""
import sys
from contextlib import asynccontextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app import server_cpu  # noqa: E402

server_cpu.quiet_openmp()  # before anything imports PyTorch

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from app import http_guard, warmup  # noqa: E402


@asynccontextmanager
async def lifespan(_app):
    warmup.start()
    yield


streamlit_app = st.App("main.py", lifespan=lifespan, middleware=[Middleware(http_guard.RefuseUndecodablePaths),
                                                                 Middleware(http_guard.CapUploadsPerSession)])
