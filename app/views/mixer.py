"""MLP-Mixer: attention replaced by a token-mixing MLP (Tolstikhin et al. 2021). The MLP read as a patches × patches
map — fixed by the weights, the same on every image — beside a ViT's attention, which the image decides."""
import streamlit as st

from app import display, image_input, url_state, widgets
from models import families
from viz.figures.mixer import MAPS, MatrixOptions, MixingOptions
from viz.figures.vit import QueryOptions

SHARED = ["model_mixer", *image_input.shared_keys("mixer"), "mixer_vit", "mixer_layer", "mixer_row", "mixer_col",
          "mixer_map"]
url_state.restore(SHARED, {"mixer_layer": url_state.within(0, 10_000), "mixer_row": url_state.within(0, 10_000),
                           "mixer_col": url_state.within(0, 10_000)})

st.title("MLP-Mixer: mixing without attention")
spec = widgets.model_picker("mixer")
widgets.model_card(spec)
loaded = widgets.load_or_stop(spec)
widgets.mini_classifier_card(spec)
st.markdown("Each Mixer block mixes the patches with one MLP shared by every channel, "
            "y = W₂·GELU(W₁u + b₁) + b₂, where a ViT has softmax(QKᵀ/√d). Drawn as a map here is its **Jacobian at "
            "u = 0, M = W₂·diag(GELU′(b₁))·W₁**: the linear map the MLP applies to small inputs, fixed by the weights "
            "alone (W₂W₁ with each hidden unit weighted by how open its GELU is at rest; the bare product would "
            "ignore that). *At this image* shows the Jacobian at the actual input, averaged over channels: how far "
            "the nonlinearity moves it. The maps are signed, and their rows do not sum to 1.")

inputs = image_input.image_picker("mixer")
if inputs is None:
    st.stop()
result = widgets.run_or_stop(loaded, inputs)
rows, cols = result.image.patch_grid
layers = len(result.fixed_mixing)
for state_key, limit in (("mixer_layer", layers), ("mixer_row", rows), ("mixer_col", cols)):
    if st.session_state.get(state_key, 0) >= limit:  # another model with fewer blocks or patches was picked
        del st.session_state[state_key]

c1, c2, c3, c4 = st.columns(4)
layer = c1.slider("Block", 0, layers - 1, layers - 1, key="mixer_layer")
row = c2.slider("Patch row", 0, rows - 1, rows // 2, key="mixer_row")
col = c3.slider("Patch column", 0, cols - 1, cols // 2, key="mixer_col")
which = c4.radio("Mixer map", list(MAPS), key="mixer_map", format_func=lambda m: {"fixed": "fixed (weights)",
                                                                                    "input": "at this image"}[m])

vit_specs = families.specs("vit")
vit_labels = [s.label for s in vit_specs]
mini_vit = next((i for i, s in enumerate(vit_specs) if s.source == "mini"), 0)  # the same shapes, the same 8 × 8 grid
vit_choice = st.selectbox("ViT to compare with (same image, same patch, head average)", vit_labels, index=mini_vit,
                          key="mixer_vit")
vit_loaded = widgets.load_or_stop(vit_specs[vit_labels.index(vit_choice)])
vit_result = widgets.run_or_stop(vit_loaded, inputs)
vit_rows, vit_cols = vit_result.image.patch_grid
vit_layers = vit_result.maps("self").num_layers
vit_layer = round(layer * (vit_layers - 1) / max(1, layers - 1))  # the same relative depth
vit_row, vit_col = round(row * (vit_rows - 1) / max(1, rows - 1)), round(col * (vit_cols - 1) / max(1, cols - 1))

left, right = st.columns(2)
with left:
    st.markdown(f"**Mixer, block {layer}: {'fixed' if which == 'fixed' else 'at this image'}**")
    if (mixed := widgets.figure_or_none("mixing", result, MixingOptions(layer=layer, row=row, col=col,
                                                                        map=which))) is not None:
        display.show(mixed, "mixer_mixing")
        st.caption(f"At this image the map differs from the fixed one by "
                   f"{mixed.payload()['input_dependence']:.0%} (‖M(x) − M(0)‖ / ‖M(0)‖, block {layer}).")
with right:
    st.markdown(f"**ViT {vit_loaded.spec.short_name}, layer {vit_layer}: attention of patch ({vit_row}, {vit_col})**")
    if (attended := widgets.figure_or_none("patch_query", vit_result, QueryOptions(
            layer=vit_layer, head=None, row=vit_row, col=vit_col))) is not None:
        display.show(attended, "mixer_vit_query")
st.caption("Change the image: the Mixer's fixed map stays exactly the same (only the photo under it changes), the "
           "ViT's attention follows the content.")

st.subheader("The whole map")
if (matrix := widgets.figure_or_none("mixing_matrix", result, MatrixOptions(layer=layer, map=which))) is not None:
    display.show(matrix, "mixer_matrix")
if result.predictions and (predicted := widgets.figure_or_none("predictions", result)) is not None:
    with st.expander("The Mixer's predictions"):
        display.show(predicted, "mixer_predictions")
url_state.publish(SHARED)
