"""The sidebar every page shares: device and dtype choice, and what the device has in memory."""
import streamlit as st

from app import presentation
from models.core import loading
from viz.heatmap import COLOR_SCHEMES


def render() -> None:
    presentation.restore()  # before the colour scale is drawn: presentation mode shows cividis there
    devices = loading.available_devices()
    with st.sidebar:
        st.caption("Compute")
        device = st.selectbox("Device", devices, key="device", help="CUDA when present, else Apple MPS, else CPU.")
        dtypes = loading.available_dtypes(device)
        st.selectbox("Precision", dtypes, key="dtype", help="Half precision is offered on GPUs only.")
        st.caption(loading.describe_device(device))
        st.caption("Display")
        if st.session_state.get("scheme") not in COLOR_SCHEMES:
            st.session_state["scheme"] = presentation.color_scheme()
        st.selectbox("Colour scale", COLOR_SCHEMES, key="scheme",
                     help="The colour scale of every heatmap. cividis is readable for colour-blind viewers and "
                          "survives projectors (presentation mode switches to it).")
    presentation.toggle()


def device_choice() -> tuple[str, str]:
    """(device, dtype) picked in the sidebar, with safe defaults before the sidebar has rendered."""
    device = st.session_state.get("device") or loading.available_devices()[0]
    dtype = st.session_state.get("dtype") or loading.available_dtypes(device)[0]
    return device, dtype
