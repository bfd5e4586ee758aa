"""Shareable links: a page lists the widget keys that make its figure (model, input, layer, head, options); their
values live in the URL's query string (``st.query_params``), so a copied link reproduces the figure.

On the first run of a session the URL's values are copied into the widgets' state (``restore``); afterwards every
run writes the state back (``publish``). Values from a URL are untrusted: the coercers below refuse what a widget
could not take, which leaves that widget at its default. Uploads are never put in a link.

``restore`` also keeps a page's widgets showing what the page uses after a run that stopped early (``stopped_early``,
called by ``widgets.stop``): Streamlit keeps the values of widgets such a run did not draw, but the browser forgets
those widgets, and draws them again at their defaults while the page goes on using the kept values (issue 28: the
controls said layer 0, the figure drew layer 18). A value set through session state is sent with its widget, so the
run after a stop sets each kept value again.
"""
from __future__ import annotations

import math
from typing import Callable

import streamlit as st

MAX_URL_TEXT = 1500  # longer inputs are not put in the URL (browsers and chat apps cut long links)
OMITTED = "_omitted"  # URL name suffix: a text left out of the link, its value the text's length in characters
_LINKED = "_url_state_linked"  # the keys whose values came from the link the session opened with
_STOPS = "_url_state_stops"  # how many runs of this session stopped before drawing every widget


def stopped_early() -> None:
    """Note that this run stops before the page's later widgets are drawn (``widgets.stop``)."""
    st.session_state[_STOPS] = st.session_state.get(_STOPS, 0) + 1


def _resend_after_stop(keys: list[str], marker: str) -> None:
    """Once after each early stop: set the kept values of ``keys`` again, so the widgets drawn afresh show them."""
    stops = st.session_state.get(_STOPS, 0)
    if st.session_state.get(marker + "_stops", 0) == stops:
        return
    st.session_state[marker + "_stops"] = stops
    for key in keys:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def restore(keys: list[str], coerce: dict[str, Callable] | None = None, names: dict[str, str] | None = None) -> None:
    """Once per session and page: widget state from the URL for ``keys`` (values are strings in a URL).

    ``names`` maps a state key to a shorter URL name (e.g. a per-model key ``tr_layer_<model>`` -> ``tr_layer``)."""
    names = names or {}
    marker = "_restored_" + "|".join(names.get(key, key) for key in keys)
    if st.session_state.get(marker):
        _resend_after_stop(keys, marker)
        return
    st.session_state[marker] = True
    st.session_state[marker + "_stops"] = st.session_state.get(_STOPS, 0)
    coerce = coerce or {}
    for key in keys:
        name = names.get(key, key)
        if name + OMITTED in st.query_params and name not in st.query_params:
            try:
                st.session_state[_left_out(key)] = int(st.query_params[name + OMITTED])
            except ValueError:
                pass
        if name in st.query_params:
            value = st.query_params[name]
            try:
                parsed = coerce.get(key, str)(value)
                if isinstance(parsed, float) and not math.isfinite(parsed):  # float("nan"), float("1e309")
                    raise ValueError(f"{name}={value!r} is not a finite number")
                st.session_state[key] = parsed
                st.session_state.setdefault(_LINKED, set()).add(key)
            except (TypeError, ValueError):
                pass  # a hand-edited link with a bad value: keep the default


def from_link(key: str) -> bool:
    """Whether ``key``'s value was set by the link the session opened with."""
    return key in st.session_state.get(_LINKED, ())


def _left_out(key: str) -> str:
    return f"_url_left_out_{key}"


def left_out(key: str) -> int | None:
    """The length in characters of the text the page's link was made with but could not carry (``key``'s), or
    None when the link carried it or said nothing."""
    return st.session_state.get(_left_out(key))


def forget_left_out(key: str) -> None:
    st.session_state.pop(_left_out(key), None)


def publish(keys: list[str], names: dict[str, str] | None = None) -> None:
    """Write the current values of ``keys`` into the URL. A text longer than the URL limit is left out, and the link
    says so (``<name>_omitted=<characters>``) so that the page it opens can tell its visitor."""
    names = names or {}
    for key in keys:
        name, value = names.get(key, key), st.session_state.get(key)
        too_long = isinstance(value, str) and len(value) > MAX_URL_TEXT
        if too_long:
            st.query_params[name + OMITTED] = str(len(value))
        else:
            st.query_params.pop(name + OMITTED, None)
        if value is None or too_long:
            st.query_params.pop(name, None)
            continue
        text = str(value)
        if st.query_params.get(name) != text:
            st.query_params[name] = text


def choice(kind: str) -> Callable[[str], object]:
    """A layer or a head from the URL, as ``models.core.selection`` reads one ("3", "last", "mean"; also the labels
    older links carry, "head 3", "average of heads")."""
    from models.core import selection

    return lambda text: selection.parse(text, kind)


# Coercers for ``restore``: a value they refuse (ValueError) leaves the widget at its default. Selectboxes, radios and
# number inputs ignore values outside their options themselves; a slider given one would stop the page.
def within(low: float, high: float, cast: Callable = int) -> Callable[[str], float]:
    """A number from the URL, refused outside ``[low, high]`` (for sliders)."""

    def parse(text: str):
        value = cast(text)
        if not low <= value <= high:
            raise ValueError(f"{value} is outside {low}..{high}")
        return value

    return parse


def flag(text: str) -> bool:
    """A toggle or checkbox: the URL holds ``True`` or ``False``."""
    if text not in ("True", "False"):
        raise ValueError(f"{text!r} is not True or False")
    return text == "True"


def integers(text: str) -> tuple[int, ...]:
    """A tuple or list of integers as ``str`` wrote it: ``(4, 6)`` or ``[0, 3]`` -> ``(4, 6)`` / ``(0, 3)``."""
    inner = text.strip().strip("()[]")
    return tuple(int(part) for part in inner.split(",") if part.strip())
