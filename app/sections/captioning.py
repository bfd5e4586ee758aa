"""The captioning page's sections: decoding settings, the caption against the scene's reference, the step-through, the
layers and heads, the faithfulness test, the three minis compared, and where every image token came from. Widgets
only: the numbers come from ``models.families.captioning`` through the cached views."""
from __future__ import annotations

import numpy as np
import streamlit as st

from models.core import selection

from app import display, resources, tables, url_state, widgets
from app.sections import faithfulness as faithfulness_section
from models.analysis.methods import method_name
from models.families.captioning import model as captioning
from models.minis.captioning import metrics as scene_metrics
from models.minis.captioning import scenes
from viz.figures.captioning import (
    CandidatesOptions,
    CaptionFaithfulnessOptions,
    HeadsOptions,
    WordOptions,
)

SHARED = ["cap_word", "cap_heads_layer", "cap_faith_word", "cap_faith_steps"]
def number_or_word(text: str) -> int | str:
    """A layer or head from the URL: a number (``3``) or one of the averages' labels, as the selectbox holds it."""
    return int(text) if text.strip().isdigit() else text


def keep_valid(key: str, options: list) -> None:
    """Drop a stale choice (another model with fewer layers, a link's value) so the widget falls back to its default."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]


COERCE = {"cap_word": url_state.within(0, 500), "cap_faith_word": url_state.within(0, 500),
          "cap_faith_steps": url_state.within(5, 40), "cap_heads_layer": number_or_word}
EACH_LAYER = "every layer (heads averaged)"
# sample scenes to click: three objects first, then two, then one. The page opens on the first: a scene the default
# mini (Show, Attend and Tell) captions word for word, as does the decoder-only mini (25: all three minis)
SCENES = (56, 359, 25, 93, 0, 7)


def scene_buttons() -> None:
    """The sample scenes as small pictures to click (each sets the seed below)."""
    from PIL import Image

    current = st.session_state.get("cap_seed", SCENES[0])
    for column, seed in zip(st.columns(len(SCENES)), SCENES):
        scene = scenes.page_scene(seed)
        column.image(Image.fromarray(scene.image).resize((96, 96), Image.Resampling.NEAREST))
        column.button(f"scene {seed}", key=f"cap_scene_{seed}", width="stretch",
                      type="primary" if current == seed else "secondary",
                      on_click=lambda chosen=seed: st.session_state.update(cap_seed=chosen))


def show(figure, key: str) -> None:
    """A figure with its caption as plain text (captions carry the model's own words)."""
    display.show(figure, key, caption=False)
    if figure.caption:
        st.caption(widgets.plain(figure.caption))


def mini_summary(spec) -> None:
    """A mini's measured caption accuracy and pointing game, with its card."""
    card, metrics = resources.mini_card(spec)
    if metrics is None:
        return
    nouns = metrics["pointing"]["nouns"]
    st.caption(f"Measured on {metrics['test_scenes']:,} held-out scenes: caption exact match "
               f"**{metrics['exact_match']:.1%}**; nouns point at their object **{nouns['default']:.1%}** of the time "
               f"(random cell {nouns['random']:.1%}).")
    with st.expander("Model card"):
        st.markdown(card)


def decoding_settings(loaded) -> captioning.CaptionSettings:
    c1, c2, c3 = st.columns([1, 1, 2])
    strategy = c1.radio("Decoding", captioning.STRATEGIES, horizontal=True, key="cap_strategy")
    beams = int(c2.slider("Beam width", 2, 8, 3, key="cap_beams", disabled=strategy != "beam search"))
    instruction, tiles = "", True
    if loaded.architecture == "decoder-only" and loaded.spec.source != "mini":
        instruction = c3.text_input("Instruction", key="cap_instruction", max_chars=500,
                                    placeholder="Describe this image in one sentence.")
        if loaded.model.config.model_type in ("idefics3", "smolvlm"):
            tiles = st.toggle("Cut the image into tiles (plus a thumbnail), as the model was trained", True,
                              key="cap_tiles", help="off: the thumbnail only, 64 image tokens — much faster on CPU")
    return captioning.CaptionSettings(strategy=strategy, num_beams=beams, instruction=instruction, tiles=tiles)


def caption_line(result, scene) -> None:
    """The caption in large type, and against the grammar's reference on a generated scene."""
    st.markdown(f"### “{widgets.plain(result.caption)}”")
    seconds = f"{result.seconds * 1000:.0f} ms" if result.seconds < 10 else f"{result.seconds:.1f} s"
    st.caption(f"{len(result.words)} tokens, {result.strategy}" + (f" ({result.num_beams} beams)" if result.num_beams
                                                                   > 1 else "") +
               f"; decoding with every word's attention kept: {seconds} on {result.model.device}. "
               f"{widgets.plain(result.regions.description)}.")
    if scene is not None:
        said = result.caption == scene.caption
        st.caption(("✓ the reference, word for word: " if said else "✗ the grammar's reference: ") +
                   f"“{scene.caption}”")


def scene_pointing(result, scene, layer, head) -> None:
    """On a generated scene described right, each colour word and noun: does its map's top cell touch its object?"""
    if scene is None or result.caption != scene.caption or result.regions.count != 64:
        return
    maps = captioning.word_attention(result, *captioning.chosen(result, layer, head))
    rows = []
    coverage = np.stack([scene_metrics.cell_coverage(o.mask) for o in scene.objects])
    for t, word in enumerate(scene.words):
        if word.role not in scene_metrics.SCORED_ROLES:
            continue
        top = int(np.argmax(maps[t]))
        rows.append({"word": f"{t}: {word.text}", "names": scene.objects[word.object].name,
                     "top cell": f"({top // 8}, {top % 8})",
                     "touches its object": bool(scene_metrics.hit(coverage, word.object, top)),
                     "mostly its object": bool(scene_metrics.right_object(coverage, word.object, top))})
    st.markdown("**On this scene** the grammar knows each object's mask: does each noun's and colour word's "
                "most-attended cell touch the object it names?")
    tables.show(rows)


def _word_picker(result, key: str, label: str = "Word") -> int:
    labels = [f"{i}: {w}" for i, w in enumerate(result.words)]
    default = next((i for i, w in enumerate(result.words) if w in scenes.SHAPES), 0)
    if not isinstance(st.session_state.get(key), int) or not 0 <= st.session_state[key] < len(labels):
        st.session_state[key] = default  # first visit, or a shorter caption than the last one
    if len(labels) == 1:
        return 0
    return int(st.select_slider(label, options=list(range(len(labels))), format_func=lambda i: labels[i], key=key))


def step_through(result, drawn: dict) -> None:
    word = _word_picker(result, "cap_word", "Step")
    st.markdown(f"So far: *{widgets.plain(' '.join(result.words[:word])) or '(nothing yet)'}* → "
                f"**{widgets.plain(result.words[word])}**")
    left, right = st.columns([3, 2])
    with left:
        if (figure := widgets.figure_or_none("caption_word", result, WordOptions(word=word, **drawn))) is not None:
            show(figure, "cap_word_fig")
    with right:
        if (figure := widgets.figure_or_none("caption_candidates", result, CandidatesOptions(word=word))) is not None:
            show(figure, "cap_candidates")


def layers_and_heads(result, drawn: dict) -> None:
    layers = captioning.image_layers(result)
    if layers == 1 and captioning.image_heads(result, 0) == 1:
        st.info("Show, Attend and Tell has one attention (one layer, one head): its α is the strip itself.")
        return
    c1, c2 = st.columns(2)
    with c1:
        word = _word_picker(result, "cap_heads_word")
    keep_valid("cap_heads_layer", [EACH_LAYER, *range(layers)])
    choice = c2.selectbox("Layers or heads", [EACH_LAYER, *range(layers)], key="cap_heads_layer",
                          format_func=lambda c: c if isinstance(c, str) else f"every head of layer {c}")
    options = HeadsOptions(word=word, layer=selection.ALL if isinstance(choice, str) else int(choice),
                           **{k: v for k, v in drawn.items() if k not in ("layer", "head")})
    if (figure := widgets.figure_or_none("caption_heads", result, options)) is not None:
        show(figure, "cap_heads")


def faithfulness(result, loaded, layer, head, colormap: str) -> None:
    hub = loaded.spec.source != "mini"
    if hub and loaded.architecture != "decoder-only":
        st.info("The faithfulness test runs on the three minis and on decoder-only VLMs.")
        return
    c1, c2 = st.columns([3, 1])
    with c1:
        word = _word_picker(result, "cap_faith_word", "Word to test")
    steps = int(c2.slider("Curve steps", 5, 40, 8 if hub else 16, key="cap_faith_steps"))
    if hub:
        runs = (1 + 5) * 2 * (steps + 1)
        st.warning(f"On a hub VLM the test re-runs the model on about {runs} greyed pictures: minutes on a CPU "
                   "(turn the tiles off above for a quicker test). Only raw attention is tested against random "
                   "orders.")
        if not st.toggle("Run the test", key="cap_faith_run"):
            return
    options = CaptionFaithfulnessOptions(word=word, steps=steps, layer=layer, head=head, colormap=colormap)
    maps = faithfulness_section.figure("caption_explanations", result, options, loaded, "Explaining")
    if maps is None:
        return
    show(maps, "cap_explanations")
    # the same analysis, cached by now: its typed result and its curves
    found = resources.analysis("caption_faithfulness", result, options, loaded)
    curves = resources.figure("caption_faithfulness", result, options, loaded)
    st.markdown(f"**Word:** {widgets.plain(found.target_name)}, p = {found.probability:.3f}. "
                "**Deletion** greys out the most relevant image regions first (a faithful map "
                "makes p fall fast: low area); **insertion** starts from a grey image and reveals "
                f"them (p should rise fast: high area). Random: {found.seeds} shuffled orders.")
    tables.show(curves.table(), faithfulness_section.AUC_FORMATS)
    if "raw_attention" in found.weak:
        st.warning("Raw attention does no better than random for this word: greying out "
                   "the regions it attends to most lowers the word's probability no faster "
                   "than greying out random regions (and revealing them raises it no faster). "
                   "Here the map is not an explanation of the word.")
    elif found.weak:
        weak = ", ".join(map(method_name, found.weak))
        st.warning(f"No better than random on this word: {weak}.")
    else:
        st.success("Raw attention does better than random for this word on both curves.")
    show(curves, "cap_curves")


def architectures() -> None:
    found = widgets.figure_or_none("caption_architectures")
    if found is None:
        return
    st.markdown(captioning.closest_to_truth(captioning.mini_metrics())[1])
    show(found, "cap_architectures")
    st.caption("Nouns and colour words of held-out scenes, the reference caption forced through each decoder; a hit "
               "when the word's most-attended of the 8 × 8 cells touches the object's mask. The Transformers' maps "
               "are averaged over layers and heads (their cards give each layer). Each card reports its own "
               "numbers: models/minis/captioning, sample_data/captioning/*/card.md.")


def image_tokens(result, colormap: str) -> None:
    regions = result.regions
    st.markdown(f"**{regions.count} image tokens** from {len(regions.frames)} frame(s): "
                f"{widgets.plain(regions.description)}.")
    if (figure := widgets.figure_or_none("caption_regions", result)) is not None:
        show(figure, "cap_regions")
        tables.show(figure.table())
    if result.sink_scores is not None and (figure := widgets.figure_or_none("caption_sinks", result)) is not None:
        show(figure, "cap_sinks")
    if result.prompt:
        st.caption("Prompt: " + widgets.plain(result.prompt))
