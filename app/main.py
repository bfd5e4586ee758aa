"""The script every browser session runs: page config, the shared sidebar, and routing to one page per file in
app/views/. The server's entry point is app/streamlit_app.py."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # Streamlit puts only app/ on the path
    sys.path.insert(0, str(ROOT))

from app import server_cpu  # noqa: E402

server_cpu.quiet_openmp()  # under a plain `streamlit run app/main.py` too, before PyTorch is imported

import streamlit as st  # noqa: E402

from app import run_log, warmup  # noqa: E402
from models.core import memory  # noqa: E402

started = run_log.begin()  # None unless ATTN_EXPLORER_RUN_LOG names a file (the load benchmark)

memory.use_fixed_mmap_threshold()  # also under a plain `streamlit run app/main.py`, where no warm-up ran

from app import presentation  # noqa: E402

# a presentation link opens with the sidebar tucked away: the projector's width goes to the figures
st.set_page_config(page_title="Attention explorer", page_icon=":material/visibility:", layout="wide",
                   initial_sidebar_state="collapsed" if presentation.requested() else "auto")
if not warmup.wait_for_imports(0):  # the server is still importing PyTorch; importing it here too is unsafe
    with st.spinner("Starting up: loading PyTorch and the default model…"):
        warmup.wait_for_imports()

from app import sidebar  # noqa: E402

from app import catalog  # noqa: E402

# Every page in the catalog is routed; a missing file is an error here and in the tests, never a quietly hidden page.
pages = {section: [st.Page(str(page.file), title=page.title, icon=page.icon, url_path=page.name,
                           default=(page is catalog.PAGES[0])) for page in listed]
         for section, listed in catalog.sections().items()}
navigation = st.navigation(pages, expanded=True)  # every page one click away, none behind "View more"
with run_log.finished(started, navigation.url_path):
    sidebar.render()
    navigation.run()
