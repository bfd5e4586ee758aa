"""Pure plotting: arrays in, an ``alt.Chart`` or a ``PIL.Image`` out. Never imports Streamlit, never runs a model."""
