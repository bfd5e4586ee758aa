"""Entry point: page config, the shared sidebar, and routing to one page per file in app/views/."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run app/streamlit_app.py` puts only app/ on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import sidebar  # noqa: E402

st.set_page_config(page_title="Attention explorer", page_icon="🔎", layout="wide")

# (file in app/views, title, icon). A page whose file does not exist yet is simply not listed.
PAGES = [
    ("gpt", "Language model (GPT)", "💬"),
    ("encoder", "Encoder (BERT)", "🧩"),
    ("translation", "Translation", "🌍"),
    ("vit", "Vision Transformer", "🖼️"),
    ("swin", "Swin Transformer", "🪟"),
    ("moe", "Mixture of experts", "🔀"),
    ("positional", "Positional encodings", "📐"),
    ("mechanics", "How attention works", "🧮"),
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
