"""Object detection (DETR, Carion et al. 2020): every object query's decoder cross-attention over the image, drawn
with the box and class that query predicts — the paper's Fig. 6 — on generated shapes, the sample photos or yours."""
import numpy as np
import streamlit as st

from models.core import selection
from PIL import Image

from app import display, image_input, resources, tables, url_state, widgets
from models.core.inputs import ImageInput
from models.minis.detr_shapes import data as scenes
from viz.figures.detr import BoxesOptions, QueriesOptions, QueryOptions

SOURCES = ("Generated shapes", "Photo or your image")
BOX_COLUMNS = {"class_id": "class id", "no_object": "no-object probability"}  # the CSV keeps the field names
BOX_FORMATS = {"score": "%.3f", "no-object probability": "%.3f", "x0": "%.1f", "y0": "%.1f", "x1": "%.1f",
               "y1": "%.1f"}  # probabilities to a thousandth, box corners to a tenth of a pixel
FIRST_SCENE = 33  # three shapes, each found by one query of the mini (not every scene is: see its card)
SHARED = ["model_detr", "detr_input", "detr_seed", *image_input.shared_keys("detr"), "detr_layer", "detr_head",
          "detr_threshold", "detr_view", "detr_query"]
url_state.restore(SHARED, {"detr_seed": url_state.within(0, 9999), "detr_layer": url_state.within(0, 1000),
                           "detr_head": url_state.choice("head"),
                           "detr_threshold": url_state.within(0.0, 1.0, float), "detr_query": int})

st.title("Object detection with a Transformer decoder (DETR)")
spec = widgets.model_picker("detr")
widgets.model_card(spec)
loaded = widgets.load_or_stop(spec)
card, metrics = resources.mini_card(spec)
if metrics is not None:
    repeats = (f"; at the 50 % threshold, with no non-maximum suppression, {metrics['found_objects']:.0%} of the "
               f"objects are found and {metrics['duplicated_objects']:.0%} by more than one query"
               if "duplicated_objects" in metrics else "")
    st.caption(f"Measured on {metrics['test_images']:,} held-out generated images ({metrics['test_objects']:,} "
               f"objects): box AP@0.5 **{metrics['ap50']:.1%}**, AP@0.75 {metrics['ap75']:.1%}{repeats}.")
    with st.expander("Model card"):
        st.markdown(card)
st.markdown("A CNN turns the image into a grid of features; the encoder mixes them; a fixed set of learned **object "
            "queries** goes through the decoder, each attending to the image tokens (cross-attention) and to the "
            "other queries, and each comes out as one class (or *no object*) and one box. Below, every query that "
            "found something, with its cross-attention over the image: what it looked at to place its box.")

source = st.radio("Input", SOURCES, horizontal=True, key="detr_input")
if source == SOURCES[0]:
    seed = int(st.number_input("Scene (random seed)", 0, 9999, FIRST_SCENE, key="detr_seed",
                               help="1–3 of the mini DETR's shapes on a plain or photo background, with true boxes"))
    scene = scenes.page_scene(seed)
    inputs = ImageInput(Image.fromarray(scene.image), f"shapes {seed}")
    st.caption("True objects: " + ", ".join(f"{scenes.LABELS[label]} at x {box[0]:.0f}–{box[2]:.0f}, y "
                                             f"{box[1]:.0f}–{box[3]:.0f}" for label, box in
                                             zip(scene.labels, scene.boxes)) + " (pixels of the 64 px image).")
else:
    inputs = image_input.image_picker("detr")
    if inputs is None:
        st.stop()
result = widgets.run_or_stop(loaded, inputs)
cross = result.maps("cross")
value = st.session_state.get("detr_query")
if value is not None and not (isinstance(value, int) and 0 <= value < len(result.scores)):  # another model's
    del st.session_state["detr_query"]

c1, c2, c3 = st.columns(3)
layer, head = widgets.layer_and_head("detr", cross.num_layers, cross.num_heads, columns=(c1, c2),
                                     opening=(selection.LAST, selection.MEAN), labels=("Decoder layer", "Head"))
threshold = c3.slider("Score threshold", 0.0, 1.0, 0.5, 0.05, key="detr_threshold",
                      help="A query counts as a detection when its best class is at least this probable")
grid = result.image.patch_grid
st.caption(f"{grid[0]} × {grid[1]} = {grid[0] * grid[1]} image tokens ({result.image.patch_size[0]} px apart), "
           f"{len(result.scores)} object queries, {cross.num_layers} decoder layers × {cross.num_heads} heads. "
           f"Forward pass with capture: {result.forward_seconds * 1000:.0f} ms on {result.model.device}.")

queries_tab, query_tab, boxes_tab = st.tabs(["Queries and their attention", "One query, head by head",
                                             "All detections"], key="detr_view", on_change="rerun")
with queries_tab:
    if (figure := widgets.figure_or_none("detr_queries", result, QueriesOptions(
            layer=layer, head=head, threshold=threshold))) is not None:
        display.show(figure, "detr_queries")
with query_tab:
    order = [int(q) for q in np.argsort(-result.scores, kind="stable")]
    # The browser sends a choice back as its label, so a label names the query alone: one that also held this
    # image's class and score would not be found again on the next image, and the choice would come back as text.
    query = st.selectbox("Query (most confident first)", order, key="detr_query", format_func=lambda q: f"query {q}",
                         help="Its class and score are under the picture; 'All detections' lists every query")
    if query not in order:  # a label from an older version of this page, kept by an open tab
        query = order[0]
    if (figure := widgets.figure_or_none("detr_query", result, QueryOptions(query=query, layer=layer))) is not None:
        display.show(figure, "detr_query")
with boxes_tab:
    if (figure := widgets.figure_or_none("detr_boxes", result, BoxesOptions(threshold))) is not None:
        display.show(figure, "detr_boxes")
        tables.show(figure.table().rename(columns=BOX_COLUMNS), BOX_FORMATS)
url_state.publish(SHARED)
