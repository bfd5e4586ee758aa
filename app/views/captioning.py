"""Image captioning with attention (Xu et al. 2015, "Show, Attend and Tell"): a model writes a caption, and under
each word its attention over the image, from an LSTM with additive attention to an encoder–decoder Transformer and a
decoder-only vision–language model; is the map where the word's object is, and is it faithful?"""
import streamlit as st

from models.core import selection
from PIL import Image

from app import image_input, presentation, url_state, widgets
from app.sections import captioning as sections
from models.core.inputs import ImageInput
from models.families.captioning import model as captioning
from models.minis.captioning import scenes
from viz import image_overlay
from viz.figures.captioning import StripOptions

SOURCES = ("Generated scene", "Photo, upload or camera")
SHARED = ["model_captioning", "cap_input", "cap_seed", *image_input.shared_keys("cap"), "cap_strategy", "cap_beams",
          "cap_instruction", "cap_tiles", "cap_layer", "cap_head", "cap_view", "cap_opacity", "cap_cmap",
          "cap_smooth", "cap_clip", "cap_sinks", *sections.SHARED]
url_state.restore(SHARED, {"cap_seed": url_state.within(0, 9999), "cap_beams": url_state.within(2, 8),
                           "cap_opacity": url_state.within(0.0, 1.0, float), "cap_clip": url_state.within(
                               90.0, 100.0, float), "cap_smooth": url_state.flag, "cap_sinks": url_state.flag,
                           "cap_tiles": url_state.flag, "cap_layer": url_state.choice("layer"),
                           "cap_head": url_state.choice("head"), **sections.COERCE})

st.title("Image captioning with attention")
spec = widgets.model_picker("captioning")
widgets.model_card(spec)
if spec.notes:
    st.caption(widgets.plain(spec.notes))
loaded = widgets.load_or_stop(spec)
sections.mini_summary(spec)
st.markdown("“At each time step the decoder uses a different context vector to look at a different part of the "
            "image” (Xu et al. 2015). Below, every word of the caption with the attention that produced it: an "
            "LSTM's additive attention over a CNN grid, a Transformer decoder's cross-attention, or a "
            "vision–language model's attention from the word to its image tokens, each token drawn on the pixels it "
            "came from.")

# on a projector the input and decoding controls fold away, so the caption's strip starts above the fold
with st.expander("Input and decoding", expanded=False) if presentation.is_on() else st.container():
    source = st.radio("Input", SOURCES, horizontal=True, key="cap_input")
    scene = None
    if source == SOURCES[0]:
        sections.scene_buttons()
        seed = int(st.number_input("Scene (random seed)", 0, 9999, sections.SCENES[0], key="cap_seed",
                                   help="1–3 shapes on a 3 × 3 grid; the grammar knows every object's mask"))
        scene = scenes.page_scene(seed)
        inputs = ImageInput(Image.fromarray(scene.image), f"scene {seed}")
    else:
        inputs = image_input.image_picker("cap")
        if inputs is None:
            st.stop()
    settings = sections.decoding_settings(loaded)
result = widgets.run_or_stop(loaded, inputs, settings)
for notice in result.notices:
    st.info(widgets.plain(notice))
sections.caption_line(result, scene)

layers, heads = captioning.image_layers(result), captioning.image_heads(result, None)
c1, c2, c3 = st.columns(3)
layer, head = widgets.layer_and_head("cap", layers, heads, all_layers=True, columns=(c1, c2),
                                     opening=(selection.ALL, selection.MEAN))
exclude_sinks = c3.toggle("Leave sinks out of the colour scale", True, key="cap_sinks", disabled=not len(result.sinks),
                          help="visual attention sinks: image tokens with massive activations that soak up "
                               "attention whatever the word (decoder-only VLMs)")
with st.expander("Display", expanded=False):
    d1, d2, d3, d4 = st.columns(4)
    opacity = d1.slider("Opacity", 0.0, 1.0, 0.6, 0.05, key="cap_opacity")
    presenting = bool(st.session_state.get("presentation"))
    scheme = presentation.color_scheme()
    colormap = d2.selectbox("Colormap", image_overlay.COLORMAPS, key="cap_cmap", disabled=presenting,
                            index=image_overlay.COLORMAPS.index(scheme) if scheme in image_overlay.COLORMAPS else 0)
    smooth = d3.toggle("Smooth (half a token)", True, key="cap_smooth", help="off: each token's exact region")
    clip = d4.slider("Clip colours at percentile", 90.0, 100.0, 100.0, 0.5, key="cap_clip")
drawn = {"layer": layer, "head": head, "opacity": opacity, "colormap": scheme if presenting else colormap,
         "smooth": smooth, "clip": clip, "exclude_sinks": exclude_sinks}

strip_tab, step_tab, heads_tab, faithful_tab, compare_tab, tokens_tab = st.tabs(
    ["Caption and maps", "Step through", "Layers and heads", "Is it faithful?", "Architectures compared",
     "Image tokens"], key="cap_view", on_change="rerun")
with strip_tab:
    if (figure := widgets.figure_or_none("caption_strip", result, StripOptions(
            columns=4 if presenting else 6, **drawn))) is not None:
        sections.show(figure, "cap_strip")
    sections.scene_pointing(result, scene, layer, head)
if step_tab.open:
    with step_tab:
        sections.step_through(result, drawn)
if heads_tab.open:
    with heads_tab:
        sections.layers_and_heads(result, drawn)
if faithful_tab.open:
    with faithful_tab:
        sections.faithfulness(result, loaded, layer, head, colormap=drawn["colormap"])
if compare_tab.open:
    with compare_tab:
        sections.architectures()
if tokens_tab.open:
    with tokens_tab:
        sections.image_tokens(result, drawn["colormap"])
url_state.publish(SHARED)
