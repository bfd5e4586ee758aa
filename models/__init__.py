"""Loading, running and capturing attention of transformer models. Never imports Streamlit."""
