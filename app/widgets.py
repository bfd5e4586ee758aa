"""Widgets every page shares: model picker, loading and running with errors shown on the page, text input with
presets and upload, token limit, model card, notices."""
from __future__ import annotations

import re

import streamlit as st

from app import resources, sidebar
from models import families
from models.core import limits, text
from models.core.loading import LoadedModel
from models.core.results import RunResult
from models.core.specs import ModelSpec
from viz.figure import Figure

OTHER = "Other: a hub id or a local folder…"


_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:=&])")
# GFM turns bare URLs and e-mail addresses into links after escapes are resolved; a word joiner (U+2060, invisible)
# between "http" and "://", "www" and ".", or before "@" keeps them text
_AUTOLINK = re.compile(r"(?:https?|ftp|www)(?=[:.])|(?=@)", re.IGNORECASE)


def plain(text: str) -> str:
    """``text`` with Markdown's punctuation backslash-escaped, so ``st.error``/``st.caption`` show it as typed.

    Streamlit renders those bodies as Markdown (HTML is escaped, but not ``![img](http://…)``, links, ``**``,
    ``$math$`` or ``:red[…]``), and messages echo what a user typed: a model id, a folder, a file name.
    """
    unlinked = _AUTOLINK.sub(lambda match: match.group(0) + "\u2060", str(text))
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", unlinked)


def show_error(error: Exception | str) -> None:
    """A user-facing error as plain text: no HTML and no Markdown from the message (it may echo user input)."""
    st.error(plain(str(error)), icon="⚠️")


def model_picker(family: str) -> ModelSpec:
    """Sidebar choice among the registry's models of ``family`` (offline first) or any id/folder the user types."""
    specs = families.specs(family)
    labels = [spec.label for spec in specs] + [OTHER]
    with st.sidebar:
        st.caption("Model")
        choice = st.selectbox("Model", labels, key=f"model_{family}", label_visibility="collapsed")
        if choice != OTHER:
            return specs[labels.index(choice)]
        typed = st.text_input("Hub id or local folder", key=f"custom_model_{family}",
                              placeholder="e.g. gpt2 or ~/models/my-model")
    if not typed.strip():
        st.info("Type a hub id or a local folder in the sidebar, or pick one of the listed models.")
        st.stop()
    return families.custom(family, typed)


def load_or_stop(spec: ModelSpec) -> LoadedModel:
    """Load the model picked in the sidebar on the sidebar's device; a failure is shown and the page stops."""
    device, dtype = sidebar.device_choice()
    try:
        return resources.load(spec, device, dtype)
    except ValueError as error:
        show_error(error)
        st.stop()


def run_or_stop(loaded: LoadedModel, inputs, options=None) -> RunResult:
    """The cached run of ``loaded`` on ``inputs``; a user mistake (empty text, a bad setting, out of memory) is
    shown and the page stops."""
    try:
        return resources.run(loaded, inputs, options)
    except ValueError as error:
        show_error(error)
        st.stop()


def figure_or_none(name: str, result: RunResult | None = None, options=None,
                   loaded: LoadedModel | None = None) -> Figure | None:
    """The cached figure of view ``name``, or None after showing why it cannot be drawn (the rest of the page goes
    on: a stale layer from a link, a target the model does not have)."""
    try:
        return resources.figure(name, result, options, loaded)
    except ValueError as error:
        show_error(error)
        return None


def token_limit(default: int = text.DEFAULT_MAX_TOKENS) -> int:
    with st.sidebar:
        return int(st.number_input("Token limit", min_value=8, max_value=limits.MAX_TOKENS, value=default, step=64,
                                   key="max_tokens", help="Longer input is truncated, with a notice."))


def text_source(presets: dict[str, str], key: str, label: str = "Text", height: int = 100) -> str:
    """Presets to click, a text box, and a .txt upload; returns the text to run (may be empty)."""
    state_key = f"{key}_text"
    if state_key not in st.session_state:
        st.session_state[state_key] = next(iter(presets.values()))
    # on a projector the upload button stands beside the samples (a compact header: the figure starts above the fold)
    samples, uploads = st.columns([5, 1]) if st.session_state.get("presentation") else (st.container(),) * 2
    chosen = samples.pills("Samples", list(presets), key=f"{key}_preset", label_visibility="collapsed")
    if chosen and st.session_state.get(f"{key}_last_preset") != chosen:
        st.session_state[state_key] = presets[chosen]
    st.session_state[f"{key}_last_preset"] = chosen
    upload = uploads.file_uploader("…or upload a .txt file (UTF-8)", type=["txt"], key=f"{key}_upload")
    if upload is not None and st.session_state.get(f"{key}_last_upload") != upload.file_id:
        st.session_state[f"{key}_last_upload"] = upload.file_id
        try:
            st.session_state[state_key] = text.decode_upload(upload.getvalue())
        except ValueError as error:
            show_error(error)
    return st.text_area(label, key=state_key, height=height)


def model_card(result_or_spec: RunResult | ModelSpec) -> None:
    """One caption line saying what the model is, where its weights come from and how attention was captured."""
    if isinstance(result_or_spec, RunResult):
        info = result_or_spec.model
        st.caption(f"**{plain(info.key)}** · source: {info.source} · licence: {plain(info.licence)} · "
                   f"trained on: {plain(info.trained_on)} · {info.device}, {info.dtype} · capture: "
                   f"{plain(info.capture)}")
    else:
        spec = result_or_spec
        st.caption(f"**{plain(spec.key)}** · source: {spec.source} · licence: {plain(spec.licence)} · "
                   f"trained on: {plain(spec.trained_on)}")


def mini_classifier_card(spec: ModelSpec) -> None:
    """For a classifier this project trained (a mini), its measured held-out accuracy and its card; nothing else."""
    card, metrics = resources.mini_card(spec)
    if metrics is None:
        return
    st.caption(f"Measured on {metrics['test_images']:,} held-out generated images: accuracy "
               f"**{metrics['accuracy']:.1%}** (chance {1 / len(metrics['per_class']):.1%}).")
    with st.expander("Model card"):
        st.markdown(card)


def show_notices(result: RunResult) -> None:
    for notice in result.notices:
        st.warning(plain(notice), icon="✂️")
