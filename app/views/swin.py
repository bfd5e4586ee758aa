"""Swin Transformer: windows, the cyclic shift, attention masks and relative position bias on your own image
(Liu et al. 2021). Every structure shown is read from the loaded model's own buffers; attention is captured."""
import streamlit as st

from models.core import selection

from app import display, image_input, presentation, tables, url_state, widgets
from app.sections import faithfulness as faithfulness_section
from viz import swin_charts
from viz.figures.swin import (
    BiasOptions,
    HierarchyOptions,
    MaskOptions,
    MergingOptions,
    PatchOptions,
    ShiftOptions,
    StageOptions,
    WindowOptions,
)

# what a link carries: model, sample (never an upload), stage, tab, shift step; per-stage pickers under short names
SHARED = ["model_swin", *image_input.shared_keys("swin"), "swin_stage", "swin_view", "swin_shift_step"]
url_state.restore(SHARED, {"swin_stage": int})

st.title("Swin Transformer: shifted windows")
spec = widgets.model_picker("swin")
widgets.model_card(spec)
loaded = widgets.load_or_stop(spec)
widgets.mini_classifier_card(spec)

inputs = image_input.image_picker("swin")  # an ImageInput named "sample cat", "upload" or "camera"
if inputs is None:
    st.stop()
result = widgets.run_or_stop(loaded, inputs)
structure, crop = result.structure, result.image.image
scale = swin_charts.display_scale(crop)
first = structure.blocks[0]

left, right = st.columns(2)
if (overview := widgets.figure_or_none("stage_windows", result, StageOptions(0, scale))) is not None:
    with left:
        display.show(overview, "swin_overview", downloads=False, caption=False)
        st.caption(f"What the model saw: {crop.shape[1]} × {crop.shape[0]} px, {structure.patch_size[0]} px patches "
                   f"(white), {first.window[0]} × {first.window[1]}-token windows (yellow)")
with right:
    for notice in result.notices:
        st.caption(widgets.plain(notice))
    if result.predictions:
        if (predictions := widgets.figure_or_none("swin_predictions", result)) is not None:
            display.show(predictions, "swin_predictions", downloads=False)
    else:
        st.info(f"No class names for this head ({result.label_source}); the attention views work all the same.")

c1, c2 = st.columns(2)
stage_index = c1.selectbox("Stage", range(len(structure.stages)), key="swin_stage",
                           format_func=lambda s: f"stage {s + 1}: {structure.stages[s].resolution[0]} × "
                                                 f"{structure.stages[s].resolution[1]} tokens")
if stage_index not in range(len(structure.stages)):  # the browser sent another model's label back (it names sizes)
    stage_index = 0
stage = structure.stages[stage_index]
PER_STAGE = {f"swin_{name}_{stage_index}": f"swin_{name}"
             for name in ("head", "bias_block", "attn_block", "row", "col")}
url_state.restore(list(PER_STAGE), {f"swin_head_{stage_index}": url_state.choice("head"),
                                    f"swin_bias_block_{stage_index}": int, f"swin_attn_block_{stage_index}": int,
                                    f"swin_row_{stage_index}": url_state.within(0, stage.resolution[0] - 1),
                                    f"swin_col_{stage_index}": url_state.within(0, stage.resolution[1] - 1)},
                  PER_STAGE)
head = selection.head_index(widgets.head_picker(f"swin_head_{stage_index}", stage.heads, c2), stage.heads)
stage_blocks = structure.stage_blocks(stage_index)
default_block = structure.block_in(stage_index)  # the shifted block, else the first
no_shift = structure.no_shift_reason(stage_index) if structure.shifted_block(stage_index) is None else None


def block_picker(name: str) -> int:
    """A radio over this stage's blocks (by index: the geometry objects hold arrays), SW-MSA preselected."""
    key, options = f"swin_{name}_block_{stage_index}", [b.index for b in stage_blocks]
    if st.session_state.get(key, default_block.index) not in options:  # a link's block of another stage
        del st.session_state[key]
    chosen = st.radio("Block", options, index=options.index(default_block.index), key=key, horizontal=True,
                      format_func=lambda i: structure.blocks[i].label)
    return chosen if chosen in options else default_block.index  # another model's label, sent back by the browser


tabs = st.tabs(["Hierarchy", "Cyclic shift", "Masks", "Relative position bias", "Window attention", "Cost",
                "Faithfulness"],
               key="swin_view", on_change="rerun")

with tabs[0]:
    half = max(1, scale // 2)
    for column, s in zip(st.columns(len(structure.stages)), structure.stages):
        if (grid := widgets.figure_or_none("stage_windows", result, StageOptions(s.index, half))) is not None:
            with column:
                display.show(grid, f"swin_stage_{s.index}", downloads=False)
    if (stages := widgets.figure_or_none("hierarchy", result, HierarchyOptions(half))) is not None:
        tables.show(stages.table())
    merging = [s for s in structure.stages if s.merge is not None]
    for column, s in zip(st.columns(max(1, len(merging))), merging):
        if (merge := widgets.figure_or_none("patch_merging", result, MergingOptions(s.index))) is not None:
            with column:
                display.show(merge, f"swin_merge_{s.index}", downloads=False)
    if stages is not None:
        st.caption(stages.caption)

with tabs[1]:
    if no_shift:
        st.info(no_shift)
    else:
        step = st.select_slider("Step", swin_charts.SHIFT_STEPS, key="swin_shift_step")
        if (shift := widgets.figure_or_none("cyclic_shift", result, ShiftOptions(stage_index, step, scale))):
            st.caption(shift.caption)  # the step's explanation reads before its picture
            display.show(shift, "swin_shift", caption=False)

with tabs[2]:
    if no_shift:
        st.info(no_shift)
    elif (masks := widgets.figure_or_none("shifted_window_masks", result, MaskOptions(stage_index))) is not None:
        st.caption(masks.caption)
        display.show(masks, "swin_mask", caption=False)

with tabs[3]:
    block = block_picker("bias")
    bias_options = BiasOptions(stage_index, block, 0 if head is None else head)
    if (bias := widgets.figure_or_none("relative_position_bias", result, bias_options)) is not None:
        st.markdown(bias.caption)
        display.show(bias, "swin_bias", caption=False)

with tabs[4]:
    block = block_picker("attn")
    rows, cols = structure.blocks[block].resolution
    c1, c2 = st.columns(2)
    row = c1.slider("Patch row", 0, rows - 1, max(0, rows // 2 - 1), key=f"swin_row_{stage_index}")
    col = c2.slider("Patch column", 0, cols - 1, max(0, cols // 2 - 1), key=f"swin_col_{stage_index}")
    for column, other in zip(st.columns(len(stage_blocks)), stage_blocks):
        options = PatchOptions(stage_index, other.index, head, row, col, scale)
        if (patch := widgets.figure_or_none("patch_attention", result, options)) is not None:
            with column:
                display.show(patch, f"swin_patch_{other.index}", downloads=False)
    # the downloads hold the patch's window ("window N"); every window and the patch maps: python -m app.cli
    options = WindowOptions(stage_index, block, head, row, col, presentation.color_scheme())
    every = widgets.figure_or_none("block_windows", result, options)
    window = widgets.figure_or_none("window_attention", result, options)
    if every is not None and window is not None:
        c1, c2 = st.columns(2)
        with c1:
            display.show(every, "swin_every", downloads=False)
        with c2:
            display.show(window, "swin_attn", caption=False)
        st.caption(window.caption)

with tabs[5]:
    if (cost := widgets.figure_or_none("window_cost", result)) is not None:
        st.markdown(cost.caption)
        display.show(cost, "swin_cost", caption=False)
        tables.show(cost.table())

if tabs[6].open:  # explanations through windows and merges, and their deletion/insertion curves (issue 17)
    with tabs[6]:
        faithfulness_section.show(result, loaded, "swin_faith")
url_state.publish(SHARED)
url_state.publish(list(PER_STAGE), PER_STAGE)
