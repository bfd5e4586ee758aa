"""Widgets every page shares: model picker, loading and running with errors shown on the page, text input with
presets and upload, token limit, model card, notices."""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from typing import NoReturn

import streamlit as st

from app import resources, sidebar, url_state
from models import families
from models.core import limits, selection, text
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


def stop() -> NoReturn:
    """``st.stop()``, noting that the widgets after this point were not drawn (see ``url_state.stopped_early``): the
    next run sends their kept values again, so they show what the page uses."""
    url_state.stopped_early()
    st.stop()


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
        stop()
    return families.custom(family, typed)


def load_or_stop(spec: ModelSpec) -> LoadedModel:
    """Load the model picked in the sidebar on the sidebar's device; a failure is shown and the page stops."""
    device, dtype = sidebar.device_choice()
    try:
        loaded = resources.load(spec, device, dtype)
    except ValueError as error:
        show_error(error)
        stop()
    for note in loaded.notes:  # what loading changed or could not check, in words
        st.caption(plain(note))
    return loaded


def run_or_stop(loaded: LoadedModel, inputs, options=None) -> RunResult:
    """The cached run of ``loaded`` on ``inputs``; a user mistake (empty text, a bad setting, out of memory) is
    shown and the page stops."""
    try:
        return resources.run(loaded, inputs, options)
    except ValueError as error:
        show_error(error)
        stop()


def figure_or_none(name: str, result: RunResult | None = None, options=None,
                   loaded: LoadedModel | None = None) -> Figure | None:
    """The cached figure of view ``name``, or None after showing why it cannot be drawn (the rest of the page goes
    on: a stale layer from a link, a target the model does not have)."""
    try:
        return resources.figure(name, result, options, loaded)
    except ValueError as error:
        show_error(error)
        return None


_RATE = "_seconds_per_token_forward"  # model key -> seconds one forward pass took per prompt token, measured here


def asked(key: str, label: str, what: str, forwards: int, tokens: int, loaded: LoadedModel, inputs: tuple) -> bool:
    """Whether the visitor asked for an expensive computation on exactly these ``inputs`` (the run and the options):
    until then the section says what it costs (``forwards`` forward passes of a ``tokens``-token prompt; in seconds
    once this session has timed one on this model) and shows a button ``label``, so a tab opened in passing computes
    nothing."""
    done = st.session_state.setdefault(f"{key}_asked", set())
    if inputs in done:
        return True
    rate = st.session_state.get(_RATE, {}).get(loaded.spec.key)
    estimate = f", about {forwards * tokens * rate:.0f} s here" if rate else ""
    st.caption(f"{what} runs {forwards:,} forward passes of the {tokens}-token prompt (batched){estimate}.")
    if st.button(label, key=f"{key}_go", type="primary"):
        done.add(inputs)
        return True
    return False


@contextmanager
def timed(loaded: LoadedModel, forwards: int, tokens: int):
    """Time the computation inside the block, say how long it took, and keep the rate for the next ``asked``."""
    started = time.perf_counter()
    yield
    seconds = time.perf_counter() - started
    st.session_state.setdefault(_RATE, {})[loaded.spec.key] = seconds / max(forwards * tokens, 1)
    st.caption(f"Computed in {seconds:.1f} s ({forwards:,} forward passes).")


def token_limit(default: int = text.DEFAULT_MAX_TOKENS) -> int:
    device, _ = sidebar.device_choice()
    gpu = device.startswith("cuda")
    ceiling = limits.max_tokens(device)  # on a GPU each run is checked against its free memory instead
    if st.session_state.get("max_tokens", default) > ceiling:  # a link made for a GPU, opened on a CPU
        st.session_state["max_tokens"] = min(default, ceiling)
    with st.sidebar:
        return int(st.number_input("Token limit", min_value=8, max_value=ceiling, value=default, step=64,
                                   key="max_tokens", help="Longer input is truncated, with a notice." + (
                                       " On a GPU a run is first checked against its free memory." if gpu else "")))


def text_source(presets: dict[str, str], key: str, label: str = "Text", height: int = 100,
                token_limits: dict[str, int] | None = None) -> str:
    """Presets to click, a text box, and a .txt upload; returns the text to run (may be empty).

    A preset's button stays highlighted only while the text is that preset: typing over it or uploading a file
    clears it (the button is drawn after the upload is read, in a slot above it). ``token_limits``: presets longer
    than the sidebar's default token limit, with the limit each needs; picking one raises a lower limit to it."""
    state_key, pill_key, last_key = f"{key}_text", f"{key}_preset", f"{key}_last_preset"
    if state_key not in st.session_state:
        st.session_state[state_key] = next(iter(presets.values()))
    # on a projector the upload button stands beside the samples (a compact header: the figure starts above the fold)
    slot, uploads = st.columns([5, 1]) if st.session_state.get("presentation") else (st.container(), st)
    upload = uploads.file_uploader("…or upload a .txt file (UTF-8)", type=["txt"], key=f"{key}_upload")
    if upload is not None and st.session_state.get(f"{key}_last_upload") != upload.file_id:
        st.session_state[f"{key}_last_upload"] = upload.file_id
        try:
            st.session_state[state_key] = text.decode_upload(upload.getvalue())
        except ValueError as error:
            show_error(error)
    chosen = st.session_state.get(pill_key)
    if chosen and chosen != st.session_state.get(last_key):  # a click: load that preset
        st.session_state[state_key] = presets.get(chosen, st.session_state[state_key])
    elif chosen and st.session_state.get(state_key) != presets.get(chosen):  # its text was replaced
        st.session_state[pill_key] = chosen = None
    st.session_state[last_key] = chosen
    slot.pills("Samples", list(presets), key=pill_key, label_visibility="collapsed",
               on_change=_raise_token_limit, args=(pill_key, token_limits or {}))
    typed = st.text_area(label, key=state_key, height=height)
    _link_notes(key, typed, next(iter(presets.values())))
    return typed


def _raise_token_limit(pill_key: str, token_limits: dict[str, int]) -> None:
    """A long sample picked (a callback: before the sidebar's limit is drawn again): a lower limit is raised to what
    the sample needs, within the device's ceiling."""
    needed = token_limits.get(st.session_state.get(pill_key) or "", 0)
    ceiling = limits.max_tokens(sidebar.device_choice()[0])
    if needed and st.session_state.get("max_tokens", text.DEFAULT_MAX_TOKENS) < needed:
        st.session_state["max_tokens"] = min(needed, ceiling)


def _link_notes(key: str, typed: str, default: str) -> None:
    """What a link does with a text too long for it (``url_state.MAX_URL_TEXT``): the page that has the text offers it
    as a file; the page a link opened without its text says so while it shows its default in its place."""
    left_out = url_state.left_out(f"{key}_text")
    if left_out and typed == default:
        st.info(f"This link was made with a text of {left_out:,} characters, too long to travel in a link, so the "
                "page opened on its sample text instead. If you were sent the text as a .txt file, upload it above.")
    elif left_out:
        url_state.forget_left_out(f"{key}_text")
    if len(typed) > url_state.MAX_URL_TEXT:
        note, button = st.columns([3, 1], vertical_alignment="center")
        note.caption(f"This text ({len(typed):,} characters) is too long to travel in a link: a copied link opens "
                     "the page on its sample text (and says so). To share it, send the text as a file with the link.")
        button.download_button("Download the text (.txt)", typed, file_name=f"{key}-text.txt", mime="text/plain",
                               key=f"{key}_text_download", on_click="ignore")


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


def layer_and_head(key: str, layers: int, heads: int, *, layer_names: list[str] | None = None,
                   hybrid: bool = False, all_layers: bool = False, named_heads: bool = False,
                   opening: tuple = (0, selection.MEAN),
                   labels: tuple[str, str] = ("Layer", "Head"), columns=None,
                   disabled: tuple[bool, bool] = (False, False), layer_key: str | None = None,
                   head_key: str | None = None, mean: bool = True) -> tuple:
    """The one layer and head picker of every page (``models/core/selection.py``): a layer (a slider; a list with
    "every layer averaged" first where the view averages layers, ``all_layers``; named where the maps name their
    layers, ``layer_names``: a hybrid's attention layers under the model's own numbers, Gemma 3's "4 (local, 512)")
    and a head ("average of heads", then each head; first the heads the model names, ``named_heads``, Whisper's
    alignment heads; no average where the view reads one head, ``mean`` False). Their state (``{key}_layer``, ``{key}_head``) holds the
    choices themselves, so links carry "3", "all", "mean"; a stale one (another model's, a link's) goes back to
    ``opening``. Returns (layer choice, head choice)."""
    layer_key, head_key = layer_key or f"{key}_layer", head_key or f"{key}_head"
    names = layer_names or [f"layer {i}" for i in range(layers)]
    layer_choices = ([selection.ALL] if all_layers else []) + list(range(layers))
    opening_layer = opening[0]
    if opening_layer not in layer_choices:  # "last", "opening": the index it names here
        opening_layer = selection.layer_index(opening_layer, layers, averages=all_layers)
    opening_head = opening[1]
    if st.session_state.get(layer_key, opening_layer) not in layer_choices:
        st.session_state[layer_key] = opening_layer
    st.session_state.setdefault(layer_key, opening_layer)
    left, right = columns or st.columns(2)

    def layer_name(choice) -> str:
        return selection.LABELS[selection.ALL] if choice == selection.ALL else names[choice]

    if all_layers:
        layer = left.selectbox(labels[0], layer_choices, format_func=layer_name, key=layer_key,
                               disabled=disabled[0] or layers == 1)
    elif names != [f"layer {i}" for i in range(layers)] and layers > 1:  # named: hybrids, local/global layers
        layer = left.select_slider(labels[0] + " (attention layers only)" * hybrid, layer_choices,
                                   format_func=lambda i: names[i].removeprefix("layer "), key=layer_key,
                                   disabled=disabled[0])
    else:
        layer = left.slider(labels[0], 0, max(layers - 1, 1), key=layer_key, disabled=disabled[0] or layers == 1)
        layer = min(layer, layers - 1)
    head = head_picker(head_key, heads, right, opening=opening_head, label=labels[1], named=named_heads,
                       disabled=disabled[1] or heads == 1 and not all_layers, mean=mean)
    return layer, head


def head_picker(key: str, heads: int, column=None, *, opening=selection.MEAN, label: str = "Head",
                named: bool = False, disabled: bool = False, mean: bool = True):
    """The one head picker ("average of heads", then each head; the heads the model names first, ``named``), alone
    where a page picks its layer its own way (Swin's blocks); its state holds the choice itself. Returns the head
    choice."""
    choices = [selection.NAMED] * named + [selection.MEAN] * mean + list(range(heads))
    fallback = opening if opening in choices else choices[0]
    if st.session_state.get(key, fallback) not in choices:  # another model's, a link's "head 9"
        st.session_state[key] = fallback
    st.session_state.setdefault(key, fallback)
    return (column or st).selectbox(label, choices, format_func=selection.head_label, key=key, disabled=disabled)
