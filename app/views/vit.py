"""Vision Transformer: [CLS] attention over your own image, any patch as the query, attention rollout beside captum
attributions, and mean attention distance against depth (Dosovitskiy et al. 2021; Abnar & Zuidema 2020)."""
import streamlit as st

from models.core import selection

from app import display, image_input, presentation, url_state, widgets
from app.sections import faithfulness as faithfulness_section
from app.sections import vit_high_norm, vit_prefix
from app.sections import why as why_section
from models.analysis.methods import METHODS, PIXELS
from models.analysis.rollout import HEAD_FUSIONS
from viz import image_overlay
from viz.figures.vit import (
    AttributionOptions,
    ClsHeadsOptions,
    ClsOptions,
    InputOptions,
    PrefixOptions,
    QueryOptions,
    RolloutOptions,
    SaliencyOptions,
)

# what a link carries: model, sample (never an upload), layer, head, tab and the view options
SHARED = ["model_vit", *image_input.shared_keys("vit"), "vit_layer", "vit_head", "vit_view", "vit_opacity", "vit_cmap",
          "vit_upsampling", "vit_clip", "vit_row", "vit_col", "vit_fusion", "vit_discard", "vit_class", "vit_method",
          "vit_steps", *vit_prefix.SHARED, *vit_high_norm.SHARED, *why_section.keys("vit")]
url_state.restore(SHARED, {"vit_layer": url_state.within(0, 10_000), "vit_head": url_state.choice("head"),
                           "vit_row": url_state.within(0, 10_000),
                           "vit_mark_high_norm": url_state.flag, "vit_high_norm_in_scale": url_state.flag,
                           "vit_col": url_state.within(0, 10_000), "vit_opacity": url_state.within(0.0, 1.0, float),
                           "vit_clip": url_state.within(90.0, 100.0, float),
                           "vit_discard": url_state.within(0.0, 0.95, float), "vit_steps": url_state.within(8, 64),
                           **why_section.coerce("vit")})


def picture(figure, where, key: str, downloads: bool = True) -> None:
    """A figure (``display.show``) in ``where`` (a column, or the page), when it could be drawn."""
    if figure is not None:
        with where:
            display.show(figure, key, downloads=downloads)


st.title("Vision Transformer: attention over an image")
spec = widgets.model_picker("vit")
widgets.model_card(spec)
if spec.notes:
    st.caption(spec.notes)
loaded = widgets.load_or_stop(spec)
inputs = image_input.image_picker("vit")
if inputs is None:
    st.stop()
result = widgets.run_or_stop(loaded, inputs)
for notice in result.notices:
    st.info(widgets.plain(notice))
info, maps = result.image, result.maps("self")
rows, cols = info.patch_grid

left, right = st.columns([1, 2])
picture(widgets.figure_or_none("input", result), left, "vit_input", downloads=False)
right.markdown(f"**Input.** {result.preprocessing}.  \n**Tokens.** {len(info.prefix_names)} prefix "
               f"({', '.join(info.prefix_names)}) + {rows} × {cols} = {rows * cols} patches of {info.patch_size[0]} × "
               f"{info.patch_size[1]} px → {len(result.tokens)} tokens; {maps.num_layers} layers × {maps.num_heads} "
               f"heads. Forward pass with capture: {result.forward_seconds * 1000:.0f} ms on {result.model.device}.")
if result.predictions:
    picture(widgets.figure_or_none("predictions", result), right, "vit_predictions", downloads=False)
else:
    right.info(result.explanation)

with st.expander("Display", expanded=False):
    c1, c2, c3, c4 = st.columns(4)
    opacity = c1.slider("Opacity", 0.0, 1.0, 0.6, 0.05, key="vit_opacity")
    scheme = presentation.color_scheme()  # the sidebar's colour scale, when it is one of ours
    presenting = bool(st.session_state.get("presentation"))
    colormap = c2.selectbox("Colormap", image_overlay.COLORMAPS, key="vit_cmap", disabled=presenting,
                            index=image_overlay.COLORMAPS.index(scheme) if scheme in image_overlay.COLORMAPS else 0,
                            help="Presentation mode uses cividis (colour-blind safe)" if presenting else None)
    upsampling = c3.radio("Upsampling", image_overlay.UPSAMPLING, horizontal=True, key="vit_upsampling",
                          help="bilinear: the ViT paper's smooth maps; nearest: the exact patches")
    clip = c4.slider("Clip colours at percentile", 90.0, 100.0, 100.0, 0.5, key="vit_clip",
                     help="Saturate the brightest patches so one outlier does not hide the rest of the map")
    marks = vit_high_norm.controls(*st.columns(2))
drawn = dict(opacity=opacity, colormap=scheme if presenting else colormap, upsampling=upsampling, clip=clip)
attention_drawn = drawn | marks  # the attention maps also show the high-norm patches

for state_key, limit in (("vit_row", rows), ("vit_col", cols)):
    if st.session_state.get(state_key, 0) >= limit:  # another model with fewer patches was picked
        del st.session_state[state_key]
layer, head = widgets.layer_and_head("vit", maps.num_layers, maps.num_heads,
                                     opening=(result.opening_layer, selection.MEAN))
head = selection.head_index(head, maps.heads_in(layer))  # the views and sections below read the maps' index
cls_tab, query_tab, rollout_tab, distance_tab, why_tab, faithfulness_tab = st.tabs(
    ["[CLS] attention", "Any patch as query", "Rollout and attribution", "Distance and positions",
     "Why [CLS] looks here", "Faithfulness"], key="vit_view", on_change="rerun")

with cls_tab:
    if result.opening_reason:
        st.caption(result.opening_reason)
    c1, c2 = st.columns([1, 2])
    cls = widgets.figure_or_none("cls", result, ClsOptions(layer=layer, head=head, **attention_drawn))
    picture(cls, c1, "vit_cls")
    picture(widgets.figure_or_none("cls_prefix", result, PrefixOptions(layer)), c2, "vit_cls_prefix", downloads=False)
    st.markdown(f"**All {maps.num_heads} heads of layer {layer}**")
    picture(widgets.figure_or_none("cls_heads", result, ClsHeadsOptions(layer=layer, **attention_drawn)),
            st.container(), "vit_cls_heads", downloads=False)
    vit_high_norm.show(result)
    vit_prefix.show(result, layer, head, attention_drawn)

with query_tab:
    c1, c2 = st.columns(2)
    row = c1.slider("Patch row", 0, rows - 1, rows // 2, key="vit_row")
    col = c2.slider("Patch column", 0, cols - 1, cols // 2, key="vit_col")
    c1, c2 = st.columns(2)
    picture(widgets.figure_or_none("input", result, InputOptions((row, col))), c1, "vit_query_input", downloads=False)
    query = widgets.figure_or_none("patch_query", result, QueryOptions(layer=layer, head=head, row=row, col=col,
                                                                        **attention_drawn))
    if query is not None:
        picture(query, c2, "vit_query")
        st.caption(f"Share of this patch's attention on the prefix tokens (not drawn): "
                   f"{query.payload()['prefix_share']:.1%} on average over heads.")

with rollout_tab:
    c1, c2 = st.columns(2)
    fusion = c1.selectbox("Head fusion", HEAD_FUSIONS, key="vit_fusion")
    discard = c2.slider("Discard ratio", 0.0, 0.95, 0.0, 0.05, key="vit_discard",
                        help="Drop the weakest fraction of each fused layer before rolling out")
    rolled = widgets.figure_or_none("rollout", result, RolloutOptions(fusion=fusion, discard=discard,
                                                                      **attention_drawn))
    st.caption("Â = ½·A + ½·I per layer, multiplied through all layers (Abnar & Zuidema 2020); the map is the "
               "[CLS] row of the product: how much each patch flows into [CLS].")
    if rolled is not None and rolled.payload()["top_patch_share"] > 0.2:
        st.warning(f"One patch carries {rolled.payload()['top_patch_share']:.0%} of the rollout. ViTs without registers "
                   "often park global information in a few background patches (high-norm tokens; Darcet et al. 2024, "
                   "'Vision Transformers Need Registers'), and rollout inherits them. Lower 'Clip colours at "
                   "percentile' under Display to see the rest of the map.")
    if not result.is_classifier:
        c1, c2 = st.columns(2)
        picture(rolled, c1, "vit_rollout")
        if result.saliency is not None:
            saliency = widgets.figure_or_none("saliency", result, SaliencyOptions(fusion=fusion, discard=discard,
                                                                                  **drawn))
            if saliency is not None:
                picture(saliency, c2, "vit_saliency")
                c2.metric("Spearman ρ, rollout vs saliency", f"{saliency.payload()['rank_correlation_with_rollout']:.2f}")
        st.caption("No classifier, so no class attributions: the packaged saliency decoder is the only "
                   "task output there is to compare the rollout with.")
    elif not loaded.is_timm:  # the attributions read a timm ViT's blocks: rollout alone, and why not the rest
        picture(rolled, st.container(), "vit_rollout")
        st.info(f"Class attributions read a timm ViT's blocks; this {loaded.model.config.model_type} checkpoint "
                "was loaded by transformers, so the page shows its rollout alone. The same architecture saved "
                "with timm (timm.models.save_for_hf) gets the attributions too.")
    else:
        names = [f"{p.token} ({p.probability:.1%})" for p in result.predictions]
        c1, c2, c3 = st.columns(3)
        chosen = c1.selectbox("Class to explain", names, key="vit_class")
        first = "pixel_integrated_gradients"  # always beside rollout; the second is the visitor's
        second = c2.selectbox("Second method", [m for m in PIXELS if m != first], key="vit_method",
                              format_func=lambda m: METHODS[m].label)
        steps = c3.slider("IG / SHAP steps", 8, 64, 16, 8, key="vit_steps", help="more = slower, more accurate")
        target = result.predictions[names.index(chosen)].token_id
        columns = st.columns(3)
        picture(rolled, columns[0], "vit_rollout")
        if rolled is not None:
            columns[0].caption(f"rollout ({fusion}, discard {discard:.2f}): not class-specific")
        for column, method in zip(columns[1:], [first, second]):
            with column, st.spinner(f"{METHODS[method].label} for {chosen}…"):
                found = widgets.figure_or_none("attribution", result, AttributionOptions(
                    target=target, method=method, steps=steps, fusion=fusion, discard=discard, **drawn), loaded)
            if found is None:
                continue
            picture(found, column, f"vit_{method}")
            column.metric("Spearman ρ with rollout", f"{found.payload()['rank_correlation_with_rollout']:.2f}")
        st.caption("ρ near 1: attention flow and the gradient/occlusion evidence for this class rank the patches "
                   "alike; near 0: attention says little about what decided the class.")

with distance_tab:
    picture(widgets.figure_or_none("distance", result), st.container(), "vit_distance")
    if result.position_similarity is not None:
        picture(widgets.figure_or_none("positions", result), st.container(), "vit_positions", downloads=False)
if why_tab.open is not False:  # the [CLS] row's scores split into what wrote the query and the key (issue 37)
    with why_tab:
        why_section.show(result, loaded, "vit", cls_only=True)
if faithfulness_tab.open:  # explanations and their deletion/insertion curves (issue 17): only when looked at
    with faithfulness_tab:
        faithfulness_section.show(result, loaded, "vit_faith")
url_state.publish(SHARED)
