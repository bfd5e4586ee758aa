"""The "Faithfulness" section of a page (issue 17): every explanation of one target side by side, their deletion and
insertion curves against random orders in a sortable table, and on the mini ViT shapes the pointing game and IoU
against the generator's masks. Widgets only: the numbers come from ``models.analysis.explanations`` through the cached views.

Progress: the analysis runs in a worker thread (with this session's script context, so the caches are the page's)
while this thread moves a progress bar from what the analysis reports (``explainable.reporting``); nothing is drawn
from inside a cached function, so a cache hit replays nothing.
"""
from __future__ import annotations

import threading

import numpy as np
import streamlit as st

from models.core import selection
from PIL import Image
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

from app import display, resources, tables, url_state, widgets
from models.analysis import explanations as explainable
from models.analysis.attribution import COMPLETENESS_TOLERANCE
from models.analysis.faithfulness import Faithfulness, measure_symbol
from models.analysis.methods import method_name
from models.core.inputs import ImageInput
from models.families.vit import explain as vit_explain
from viz.figures.faithfulness import FaithfulnessOptions, LocalisationOptions

MINI = "vit_shapes"
LOCALISATION_IMAGES = (8, 16, 32, 64, 128)
AUC_FORMATS = {"deletion AUC (lower better)": "%.3f", "insertion AUC (higher better)": "%.3f", "seconds": "%.2f"}


# Integrated Gradients' steps a family's default passes the completeness check with (under 5% off): SmolLM2 on the
# GPT samples needs 128 (2.5% on the coreference sample; 64 steps: 11%)
IG_STEPS = {"causal_lm": 128}

def _one_of(allowed: tuple[int, ...]):
    def parse(text: str) -> int:
        if int(text) not in allowed:
            raise ValueError(f"{text} is not one of {allowed}")
        return int(text)
    return parse
GENERATED = "a generated shape (its mask is known)"


def with_progress(label: str, compute):
    """``compute()`` in a worker thread, with a progress bar fed by the analysis' reports; its ValueError is raised
    here."""
    state = {"step": label, "fraction": 0.0}
    outcome: dict = {}

    def work():
        try:
            with explainable.reporting(lambda step, fraction: state.update(step=step, fraction=fraction)):
                outcome["value"] = compute()
        except Exception as error:  # handed to the page's thread
            outcome["error"] = error

    worker = threading.Thread(target=work, daemon=True)
    add_script_run_ctx(worker, get_script_run_ctx())
    worker.start()
    bar = None
    while worker.is_alive():
        worker.join(0.25)
        if worker.is_alive():
            bar = bar or st.progress(0.0, text=label)
            bar.progress(min(max(state["fraction"], 0.0), 1.0), text=f"{label}: {state['step']}")
    if bar is not None:
        bar.empty()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def figure(name: str, result, options, loaded, label: str):
    try:
        return with_progress(label, lambda: resources.figure(name, result, options, loaded))
    except ValueError as error:
        widgets.show_error(error)
        return None


def generated_input(seed: int):
    from models.minis.vit_shapes import data

    sample = data.make_sample(np.random.default_rng(seed))
    return sample, ImageInput(Image.fromarray(sample.image), f"generated shape {seed}")


def shared_keys(key: str) -> list[str]:
    """What a link carries of this section (not the pointing game's switch: it costs half a minute)."""
    return [f"{key}_{name}" for name in ("source", "seed", "target", "token", "replacement", "steps", "ig_steps",
                                         "loc_images", "raw_layer", "raw_head")]




def attention_maps(result):
    """The run's self-attention maps (the first kind when it has no "self")."""
    return result.attention.get("self") or next(iter(result.attention.values()))


def raw_attention_picker(result, key: str, kind: str | None = None, noun: str = "layer",
                         read: str = "its row: [CLS], the last token, or a Swin's mean") -> tuple:
    """Raw attention's layer and head choices (``widgets.layer_and_head``) for the table; default: the last layer's
    mean. ``kind``: which of the run's attention maps to pick from (None: the self-attention; "cross": a
    translator's decoder cross-attention), ``noun`` names its layers and ``read`` says which row is read."""
    maps = attention_maps(result) if kind is None else result.attention[kind]
    structure = getattr(result, "structure", None)  # a Swin's blocks say their stage and window kind
    names = [f"{noun} {i}" + (f" ({structure.blocks[i].label})" if structure is not None else "")
             for i in range(maps.num_layers)]
    layer, head = widgets.layer_and_head(key, maps.num_layers, max(maps.heads_in(i) for i in range(maps.num_layers)),
                                         layer_names=names, opening=(selection.LAST, selection.MEAN),
                                         labels=("Raw attention: layer", "Raw attention: head"),
                                         layer_key=f"{key}_raw_layer", head_key=f"{key}_raw_head")
    if head != selection.MEAN and head >= maps.heads_in(layer):  # a Swin's stages differ in heads
        head = selection.MEAN
    st.caption(f"Raw attention is read from this {noun} and head in the maps and the table ({read}).")
    return layer, head


def show(result, loaded, key: str) -> None:
    """The section for ``result`` (a ViT or causal LM prompt run) of ``loaded``; its settings live in the URL."""
    url_state.restore(shared_keys(key), {f"{key}_seed": url_state.within(0, 10**6),
                                         f"{key}_steps": url_state.within(5, 50),
                                         f"{key}_ig_steps": url_state.within(8, 128),
                                         f"{key}_loc_images": _one_of(LOCALISATION_IMAGES),
                                         f"{key}_raw_layer": url_state.within(0, 10**3),
                                         f"{key}_raw_head": url_state.choice("head")})
    try:
        _show(result, loaded, key)
    finally:
        url_state.publish(shared_keys(key))


def _show(result, loaded, key: str) -> None:
    if getattr(result, "image", None) is None:
        _show_text(result, loaded, key)
    else:
        _show_image(result, loaded, key)


def _show_text(result, loaded, key: str) -> None:
    c1, c2, c3 = st.columns([2, 1, 1])
    token = c1.text_input("Target token (empty: the model's own next token)", key=f"{key}_token", max_chars=40,
                          help="any one vocabulary token as typed; a word after a space starts with one: ' Paris'")
    steps = int(c2.slider("Curve steps", 5, 50, 20, 5, key=f"{key}_steps"))
    ig_steps = int(c3.slider("IG steps", 8, 128, IG_STEPS.get(loaded.spec.family, 32), 8, key=f"{key}_ig_steps",
                             help="More steps: a finer integral (the check under the table says how close it is)"))
    layer, head = raw_attention_picker(result, key)
    options = FaithfulnessOptions(token=token, steps=steps, ig_steps=ig_steps, layer=layer, head=head)
    maps = figure("explanations", result, options, loaded, "Explaining")
    if maps is None:
        return
    display.show(maps, f"{key}_maps")
    table_and_curves(result, loaded, options, key, "token")


def _show_image(result, loaded, key: str) -> None:
    if not getattr(result, "is_classifier", bool(result.predictions)):
        st.info("This model has no classifier (DINOv2 is a self-supervised backbone), so there is no class to explain "
                "and no probability to watch fall. Pick **mini ViT shapes** in the sidebar: it classifies offline, "
                "and its generator knows where each shape is.")
        return
    is_mini = loaded.spec.source == "mini" and loaded.spec.id == MINI
    sample = None
    if is_mini:
        c1, c2 = st.columns([2, 1])
        source = c1.radio("Explain", ["the image above", GENERATED], horizontal=True, key=f"{key}_source",
                          index=1)
        if source == GENERATED:
            seed = int(c2.number_input("Shape seed", 0, 10**6, 1, key=f"{key}_seed",
                                       help="held-out: training used seed 0, the card's test seed 987654"))
            sample, inputs = generated_input(seed)
            result = widgets.run_or_stop(loaded, inputs)
    c1, c2, c3, c4 = st.columns(4)
    names = class_names(loaded, result)
    top = result.predictions[0].token_id if result.predictions else 0
    options_list = ["top prediction"] + names if len(names) <= 1000 else ["top prediction"]
    chosen = c1.selectbox("Class to explain", options_list, key=f"{key}_target",
                          help="any class; the default is the model's own answer")
    target = top if chosen == "top prediction" else names.index(chosen)
    replacement = c2.selectbox("A removed patch becomes", list(vit_explain.REPLACEMENTS), key=f"{key}_replacement",
                               format_func=lambda r: {"mean": "grey (the mean)", "blur": "blurred"}[r])
    steps = int(c3.slider("Curve steps", 5, 50, 20, 5, key=f"{key}_steps"))
    ig_steps = int(c4.slider("IG steps", 8, 128, 32, 8, key=f"{key}_ig_steps"))
    layer, head = raw_attention_picker(result, key)
    options = FaithfulnessOptions(target=target, steps=steps, replacement=replacement, ig_steps=ig_steps, layer=layer,
                                  head=head)
    maps = figure("explanations", result, options, loaded, "Explaining")
    if maps is None:
        return
    # the same analysis as the maps': cached by now
    found = resources.analysis("faithfulness", result, options, loaded)
    left, right = st.columns([3, 2])
    with left:
        display.show(maps, f"{key}_maps")
    with right:
        _summary(found, "patch")
    if loaded.spec.family == "swin":
        right.caption("Swin: each block's window maps are carried back to its stage's grid (the cyclic shift "
                      "undone), a stage's grid reaches the previous one through the 2 × 2 patch merge, and the "
                      "rolled-out methods start from the head's mean over the last stage's tokens. Grad-CAM is on "
                      "the last stage's tokens reshaped to their grid. A unit is one "
                      f"{result.image.patch_size[0]} px patch of the first stage.")
    if is_mini:
        right.caption("The mini ViT recognises its shapes by colour: one coloured patch left is often enough, so a "
                      "deletion curve stays high until almost every patch of the shape is gone, and on a photo "
                      "without a shape every curve is flat. That is the model, not the plot.")
    table_and_curves(result, loaded, options, key, "patch")
    if sample is not None:
        _this_shape(found, sample, result)
        _localisation(loaded, key)


def class_names(loaded, result) -> list[str]:
    """The classifier's class names (a ViT's from its load, a Swin's from its head)."""
    if hasattr(loaded, "label_names"):
        return list(loaded.label_names)
    from models.families.swin import model as swin

    names = swin.class_names(loaded.model)[0]
    return list(names) if names else [f"class {i}" for i in range(int(loaded.model.num_classes))]


def _summary(found: Faithfulness, unit: str) -> None:
    units = "patches" if unit == "patch" else f"{unit}s"
    symbol = measure_symbol(found.measure)
    st.markdown(f"**Target:** {widgets.plain(found.target_name)}, {symbol} = "
                f"{found.probability:.3f}  \n**A removed {unit} becomes** "
                f"{widgets.plain(found.replacement)}.  \n**Deletion** removes the most relevant "
                f"{units} first (a faithful map makes {symbol} fall fast: low area); **insertion** "
                f"starts with every {unit} removed and reveals them ({symbol} should rise fast: "
                f"high area). Random: {found.seeds} shuffled orders.")
    delta, difference = found.explanations.ig_delta, found.explanations.ig_difference
    if delta is not None and difference:
        relative = delta / abs(difference)
        message = (f"Integrated Gradients: its scores should sum to y(x) − y(baseline) = {difference:.3g}; they miss "
                   f"by {delta:.3g} ({relative:.1%}).")
        if relative > COMPLETENESS_TOLERANCE:
            st.warning(message + " Raise the IG steps: its map is not to be trusted at this error.")
        else:
            st.caption(message)


def table_and_curves(result, loaded, options: FaithfulnessOptions, key: str, unit: str) -> None:
    """The faithfulness table, its verdict and the curves (a text page's summary above them)."""
    found = resources.analysis("faithfulness", result, options, loaded)
    if unit == "token":
        _summary(found, unit)
    curves = resources.figure("faithfulness", result, options, loaded)  # the same analysis, drawn
    # the random row has no verdict of its own and no seconds: "—", not "None"
    tables.show(curves.table(), AUC_FORMATS)
    if found.weak:
        weak = ", ".join(map(method_name, found.weak))
        st.warning("No better than random on this input (deletion AUC not below random's mean − "
                   f"1 sd, or insertion AUC not above its mean + 1 sd): {weak}.")
    display.show(curves, f"{key}_curves")


def _this_shape(found: Faithfulness, sample, result) -> None:
    coverage = vit_explain.patch_coverage(sample.mask, result.image.patch_grid).ravel()
    rows = []
    for method, scores in found.explanations.scores.items():
        hit, iou = vit_explain.pointing_and_iou(np.asarray(scores).ravel(), coverage)
        rows.append({"method": method_name(method), "top patch on the shape": hit,
                     "IoU with the shape": iou})
    st.markdown("**This shape** (the generator knows its mask): does each map's top patch touch it, and how well do the "
                "patches above the map's mean overlap the patches it covers at least half of?")
    tables.show(rows, {"IoU with the shape": "%.2f"})


def _localisation(loaded, key: str) -> None:
    st.markdown("**Over many held-out shapes**: the pointing game and IoU (the segmentation test of Chefer et al. "
                "2021a, on our generated data), every method against a random map.")
    c1, c2 = st.columns([1, 3])
    images = int(c1.select_slider("Images", [8, 16, 32, 64, 128], 32, key=f"{key}_loc_images"))
    if not c2.toggle("Run the pointing game", key=f"{key}_loc_run",
                     help=f"about {images * 0.35:.0f} s on two CPU cores; bench/case_attribution.py runs 500"):
        return
    found = figure("localisation", None, LocalisationOptions(images=images), loaded, "Pointing game")
    if found is not None:
        display.show(found, f"{key}_localisation")
