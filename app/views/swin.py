"""Swin Transformer: windows, the cyclic shift, attention masks and relative position bias on your own image
(Liu et al. 2021). Every structure shown is read from the loaded model's own buffers; attention is captured."""
from dataclasses import replace

import numpy as np
import pandas as pd
import streamlit as st

from app import image_input, resources, share, sidebar, widgets
from models import swin
from viz import export, heatmap, swin as swin_viz

# what a link carries: model, sample (never an upload), stage, tab, shift step; per-stage pickers under short names
SHARED = ["model_swin", *image_input.shared_keys("swin"), "swin_stage", "swin_view", "swin_shift_step"]
share.restore(SHARED, {"swin_stage": int})

st.title("Swin Transformer: shifted windows")
spec = widgets.model_picker("swin")
spec = spec if spec.library == "timm" else replace(spec, library="timm")
widgets.model_card(spec)
device, dtype = sidebar.device_choice()
try:
    loaded = resources.load_swin(spec, device, dtype)
except ValueError as error:
    widgets.show_error(error)
    st.stop()
card, metrics = resources.swin_card(spec)
if metrics is not None:
    st.caption(f"Measured on {metrics['test_images']:,} held-out generated images: accuracy "
               f"**{metrics['accuracy']:.1%}** (chance {1 / len(metrics['per_class']):.1%}).")
    with st.expander("Model card"):
        st.markdown(card)

picture = image_input.image_picker("swin")
if picture is None:
    st.stop()
image_key = image_input.fingerprint(picture)
key = resources.run_key(loaded)
try:
    result = resources.run_swin(loaded, key, image_key, picture)
except ValueError as error:
    widgets.show_error(error)
    st.stop()
run: swin.SwinRun = result.extras["swin"]
structure, attention, crop = run.structure, run.attention, result.image.image
scale = swin_viz.display_scale(crop)
first = structure.blocks[0]

left, right = st.columns(2)
left.image(swin_viz.stage_grid(crop, structure.stages[0], first.window, scale),
           caption=f"What the model saw: {crop.shape[1]} × {crop.shape[0]} px, {structure.patch_size[0]} px patches "
                   f"(white), {first.window[0]} × {first.window[1]}-token windows (yellow)")
with right:
    for notice in result.notices:
        st.caption(notice)
    if run.predictions:
        chart = heatmap.probability_bars([p.token for p in run.predictions], [p.probability for p in run.predictions],
                                         f"Top predictions ({run.label_source})")
        st.altair_chart(chart, width="content")
    else:
        st.info(f"No class names for this head ({run.label_source}); the attention views work all the same.")

c1, c2 = st.columns(2)
stage_index = c1.selectbox("Stage", range(len(structure.stages)), key="swin_stage",
                           format_func=lambda s: f"stage {s + 1}: {structure.stages[s].resolution[0]} × "
                                                 f"{structure.stages[s].resolution[1]} tokens")
stage = structure.stages[stage_index]
PER_STAGE = {f"swin_{name}_{stage_index}": f"swin_{name}" for name in ("head", "bias_block", "attn_block", "row", "col")}
share.restore(list(PER_STAGE), {f"swin_bias_block_{stage_index}": int, f"swin_attn_block_{stage_index}": int,
                                f"swin_row_{stage_index}": share.within(0, stage.resolution[0] - 1),
                                f"swin_col_{stage_index}": share.within(0, stage.resolution[1] - 1)}, PER_STAGE)
input_name = image_input.input_label("swin")
head_options = ["average of heads"] + [f"head {h}" for h in range(stage.heads)]
head_choice = c2.selectbox("Head", head_options, key=f"swin_head_{stage_index}")
head = None if head_choice == head_options[0] else head_options.index(head_choice) - 1
stage_blocks = [b for b in structure.blocks if b.stage == stage_index]
shifted = next((b for b in stage_blocks if b.kind == "SW-MSA"), None)
no_shift = (f"Stage {stage_index + 1} has no shifted block: its {stage.resolution[0]} × {stage.resolution[1]} "
            "tokens fit in one window, so timm sets the shift to 0 (nothing to displace). Pick an earlier stage.")


def block_picker(name: str):
    """A radio over this stage's blocks (by index: the geometry objects hold arrays), SW-MSA preselected."""
    options = [b.index for b in stage_blocks]
    default = options.index(shifted.index) if shifted is not None else 0
    chosen = st.radio("Block", options, index=default, key=f"swin_{name}_block_{stage_index}", horizontal=True,
                      format_func=lambda i: structure.blocks[i].label)
    return structure.blocks[chosen]


tabs = st.tabs(["Hierarchy", "Cyclic shift", "Masks", "Relative position bias", "Window attention", "Cost"],
               key="swin_view", on_change="rerun")

with tabs[0]:
    for column, s in zip(st.columns(len(structure.stages)), structure.stages):
        window = structure.first_block(s.index).window
        column.image(swin_viz.stage_grid(crop, s, window, max(1, scale // 2)),
                     caption=f"stage {s.index + 1}: {s.resolution[0]} × {s.resolution[1]} tokens of {s.token_px} px, "
                             f"{window[0]} × {window[1]}-token windows")
    st.dataframe(pd.DataFrame(structure.stage_rows()), hide_index=True)
    merging = [s for s in structure.stages if s.merge is not None]
    for column, s in zip(st.columns(max(1, len(merging))), merging):
        column.image(swin_viz.merge_picture(s), caption=f"into stage {s.index + 1} (the model's reduction layer)")
    st.caption("Patch merging: 2 × 2 neighbouring tokens concatenated (4C), LayerNorm, a linear layer to 2C — half "
               "the resolution, twice the width, so windows of the same M tokens cover 4× the pixels a stage later.")

with tabs[1]:
    if shifted is None:
        st.info(no_shift)
    else:
        step = st.select_slider("Step", swin_viz.SHIFT_STEPS, key="swin_shift_step")
        s = shifted.shift[0]
        st.caption({
            "original layout": f"{stage_blocks[0].label} attends inside these regular windows.",
            "shifted windows": f"{shifted.label} displaces the windows by ⌊M/2⌋ = {s} tokens (red). Border windows "
                               "are partial: more windows, of unequal sizes, would be wasteful to batch.",
            "rolled feature map": f"Instead the map is rolled by −{s} tokens (torch.roll): the top {s} rows and left "
                                  f"{s} columns wrap round to the bottom and right. Colours travel with the pixels.",
            "region ids": "Regular windows on the rolled map now mix pieces that were not neighbours. Each token gets "
                          "a region id (0–8), as in the model's own mask construction.",
            "regrouped windows": "The rolled map's windows: those framed red hold several regions, and the mask stops "
                                 f"attention between them. Afterwards the map is rolled back by +{s}.",
        }[step])
        picture = swin_viz.shift_step(crop, shifted, step, scale)
        st.image(picture)
        share.downloads(export.file_stem(spec.short_name, input_name, shifted.label, "cyclic shift", step),
                        "swin_shift", image=picture, arrays={"regions": shifted.regions()},
                        metadata={"model": spec.key, "input": input_name, "block": shifted.label, "step": step})

with tabs[2]:
    if shifted is None:
        st.info(no_shift)
    else:
        regions = shifted.regions()
        window_regions = swin.window_partition(regions, shifted.window)
        same = np.array_equal(swin.shifted_window_mask(regions, shifted.window), shifted.attn_mask)
        st.caption(f"{shifted.label}: the model's `attn_mask` buffer {tuple(shifted.attn_mask.shape)} is added to the "
                   "scores before softmax; −100 makes a weight ≈ 4·10⁻⁴⁴. Rebuilt from the region ids it is "
                   f"{'identical' if same else 'DIFFERENT'}.")
        rows_of_charts = []
        for name, index in swin.window_types(shifted.window_grid).items():
            c1, c2 = st.columns([1, 2])
            pair = (swin_viz.region_chart(window_regions[index], f"{name} (window {index}): region ids"),
                    swin_viz.mask_chart(shifted.attn_mask[index], window_regions[index], shifted.window,
                                        f"{name}: mask added to the scores"))
            c1.altair_chart(pair[0], width="content")
            c2.altair_chart(pair[1], width="content")
            rows_of_charts.append(pair)
        share.downloads(export.file_stem(spec.short_name, shifted.label, "attention masks"), "swin_mask",
                        chart=lambda rows=tuple(rows_of_charts): export.combined(
                            *(export.combined(*pair) for pair in rows), vertical=True),
                        arrays={"attn_mask": shifted.attn_mask, "window_regions": window_regions},
                        metadata={"model": spec.key, "block": shifted.label})

with tabs[3]:
    block = block_picker("bias")
    m = block.window[0]
    st.markdown(f"B is gathered from a learned table of (2M−1)² = {(2 * m - 1) ** 2} rows × {block.heads} heads at "
                f"s(Δx, Δy) = (Δx + M − 1)(2M − 1) + (Δy + M − 1) with M = {m}; Δx, Δy ∈ [−{m - 1}, {m - 1}] are the "
                "row and column offsets query − key. Shown: the model's `relative_position_bias_table` per head, "
                "and `table[relative_position_index]` for one head.")
    tables = swin.bias_table_images(block.bias_table, block.window)
    tables_chart = swin_viz.bias_tables_chart(tables, block.window)
    st.altair_chart(tables_chart, width="content")
    bias_head = 0 if head is None else head
    c1, c2 = st.columns(2)
    pair = (swin_viz.bias_matrix_chart(block.bias()[bias_head], block.window, f"B for head {bias_head}"),
            swin_viz.bias_matrix_chart(block.relative_position_index.astype(float), block.window,
                                       "relative_position_index s (buffer)"))
    c1.altair_chart(pair[0], width="content")
    c2.altair_chart(pair[1], width="content")
    share.downloads(export.file_stem(spec.short_name, block.label, f"relative position bias head {bias_head}"),
                    "swin_bias",
                    chart=lambda top=tables_chart, pair=pair: export.combined(top, export.combined(*pair),
                                                                              vertical=True),
                    arrays={"relative_position_bias_table": block.bias_table, "bias": block.bias(),
                            "relative_position_index": block.relative_position_index},
                    metadata={"model": spec.key, "block": block.label})

with tabs[4]:
    block = block_picker("attn")
    rows, cols = block.resolution
    c1, c2 = st.columns(2)
    row = c1.slider("Patch row", 0, rows - 1, rows // 2 - 1, key=f"swin_row_{stage_index}")
    col = c2.slider("Patch column", 0, cols - 1, cols // 2 - 1, key=f"swin_col_{stage_index}")
    patch_maps = {}
    for column, other in zip(st.columns(len(stage_blocks)), stage_blocks):
        values = patch_maps[f"patch_map {other.label}"] = attention.patch_map(other.index, head, (row, col))
        column.image(swin_viz.patch_attention_picture(crop, values, other, (row, col), scale),
                     caption=f"{other.label}: where token ({row}, {col}) attends ({head_choice}), roll undone")
    window_index, within = swin.window_of((row, col), block)
    weights, allowed = attention.window_head(block.index, head), block.allowed()
    c1, c2 = st.columns(2)
    scheme = share.color_scheme()
    c1.image(swin_viz.all_windows_image(weights, allowed, block.window_grid, window_index, scheme=scheme),
             caption=f"All {block.num_windows} windows of {block.label} on the rolled map, {head_choice}; grey = "
                     "blocked by the mask; red frame = the patch's window")
    window_chart = swin_viz.window_attention_chart(weights[window_index], allowed[window_index], block.window,
                                                   f"window {window_index}, query slot {within}", scheme)
    c2.altair_chart(window_chart, width="content")
    slots = [f"({i // block.window[1]},{i % block.window[1]})" for i in range(weights.shape[-1])]
    share.downloads(
        export.file_stem(spec.short_name, input_name, block.label, head_choice, f"window {window_index}"), "swin_attn", chart=window_chart,
        table=lambda: export.matrix_frame(weights[window_index], slots, slots),
        payload={"model": spec.key, "input": input_name, "stage": stage_index + 1, "block": block.label,
                 "head": head_choice, "window": window_index, "query_slot": within, "patch": [row, col],
                 "weights": weights[window_index], "allowed": allowed[window_index]},
        arrays={"windows": weights, "allowed": allowed, **patch_maps},
        metadata={"model": spec.key, "input": input_name, "block": block.label, "head": head_choice})
    st.caption(f"Rows sum to 1 (max deviation {np.abs(weights.sum(-1) - 1).max():.1e}); largest weight on a blocked "
               f"pair: {float(weights[~allowed].max(initial=0.0)):.1e}. Captured at WindowAttention.softmax, i.e. "
               "after bias and mask.")

with tabs[5]:
    lecture = swin.stage_cost(0, (56, 56), 96, (7, 7), 3)
    st.markdown(f"Full attention over 56 × 56 tokens: (56²)² = 56⁴ = **{lecture.full_entries:,}** ≈ 9.8 M entries "
                f"per head; in 7 × 7 windows M²·H·W = 49 · 3,136 = **{lecture.window_entries:,}** "
                f"({lecture.saving:.0f}× fewer). Paper, eq. 1–2: Ω(MSA) = 4hwC² + 2(hw)²C, Ω(W-MSA) = 4hwC² + "
                "2M²hwC. This model, per stage:")
    cost_chart, cost_table = swin_viz.cost_chart(structure.costs()), pd.DataFrame(structure.cost_rows())
    st.altair_chart(cost_chart, width="content")
    st.dataframe(cost_table, hide_index=True)
    share.downloads(export.file_stem(spec.short_name, "attention cost per stage"), "swin_cost", chart=cost_chart,
                    table=cost_table)

share.publish(SHARED)
share.publish(list(PER_STAGE), PER_STAGE)
