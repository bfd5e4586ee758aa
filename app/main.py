"""The script every browser session runs: page config, the shared sidebar, and routing to one page per file in
app/views/. The server's entry point is app/streamlit_app.py."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # Streamlit puts only app/ on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import warmup  # noqa: E402
from models import memory  # noqa: E402

memory.use_fixed_mmap_threshold()  # also under a plain `streamlit run app/main.py`, where no warm-up ran

st.set_page_config(page_title="Attention explorer", page_icon=":material/visibility:", layout="wide")
if not warmup.wait_for_imports(0):  # the server is still importing PyTorch; importing it here too is unsafe
    with st.spinner("Starting up: loading PyTorch and the default model…"):
        warmup.wait_for_imports()

from app import sidebar  # noqa: E402

# (file in app/views, title, icon). Material icons ship with Streamlit (emoji need a font the machine may lack).
# The first page is the default and lives at the root URL; a page whose file does not exist yet is not listed.
PAGES = [
    ("gpt", "Language model (GPT)", ":material/chat:"),
    ("encoder", "Encoder (BERT)", ":material/swap_horiz:"),
    ("translation", "Translation", ":material/translate:"),
    ("vit", "Vision Transformer", ":material/image:"),
    ("swin", "Swin Transformer", ":material/grid_view:"),
    ("moe", "Mixture of experts", ":material/call_split:"),
    ("positional", "Positional encodings", ":material/straighten:"),
    ("mechanics", "How attention works", ":material/calculate:"),
]

VIEWS = Path(__file__).resolve().parent / "views"
pages = [
    st.Page(str(VIEWS / f"{name}.py"), title=title, icon=icon, url_path=name, default=(name == "gpt"))
    for name, title, icon in PAGES
    if (VIEWS / f"{name}.py").exists()
]
navigation = st.navigation(pages)
sidebar.render()
navigation.run()
