"""How attention works, step by step, and what it costs: one small layer on a real sentence, the mask zoo, the
memory argument behind FlashAttention, windows and KV-cache tricks. Built for a lecturer at a projector."""
import numpy as np
import pandas as pd
import streamlit as st

from app import resources, share, widgets
from models import cost, mechanics
from viz import export
from viz import mechanics as charts

PRESETS = {
    "Tired animal": "The animal didn't cross the street because it was too tired to walk.",
    "River bank": "She sat on the bank of the river and watched the water.",
    "Short": "Attention is all you need.",
}

# what a link carries: the sentence, the layer's settings, the mask and its settings, the step and head shown
SHARED = ["mechanics_text", "mech_view", "mech_source", "mech_d", "mech_heads", "mech_dk", "mech_seed", "mech_scaled",
          "mech_mask", "mech_window_causal", "mech_global", "mech_grid", "mech_swin_m", "mech_mode", "mech_other",
          "mech_head", "mech_all_steps", "mech_step"]
BY_LENGTH = ["mech_real", "mech_prefix", "mech_window", "mech_stride"]  # sliders up to the token count
COST = ["cost_n", "cost_h", "cost_l", "cost_dtype", "cost_b", "kv_tokens", "kv_dtype"]
share.restore(SHARED + COST, {"mech_d": int, "mech_heads": int, "mech_dk": int, "mech_seed": int,
                              "mech_scaled": share.flag, "mech_window_causal": share.flag,
                              "mech_global": lambda text: list(share.integers(text)), "mech_grid": share.integers,
                              "mech_swin_m": int, "mech_head": int, "mech_all_steps": share.flag, "mech_step": int,
                              "cost_n": int, "cost_h": int, "cost_l": int, "cost_b": int, "kv_tokens": int})
st.title("How attention works — and what it costs")
st.latex(r"\operatorname{Attention}(Q,K,V)=\operatorname{softmax}\!\left(\frac{QK^{\top}}{\sqrt{d_k}}+M\right)V")
sentence = widgets.text_source(PRESETS, key="mechanics", label="Sentence", height=68)
c1, c2, c3, c4, c5, c6 = st.columns(6)
source = c1.selectbox("Embeddings", mechanics.EMBEDDING_SOURCES, key="mech_source", format_func=lambda s: {
    "minilm": "MiniLM, projected", "random": "seeded random"}[s])
d_model = c2.select_slider("Model width D", [4, 6, 8, 12, 16], value=8, key="mech_d")
heads = c3.select_slider("Heads H", [1, 2, 3, 4, 8], value=2, key="mech_heads")
d_head = c4.select_slider("Head width d_k", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], value=4, key="mech_dk")
seed = int(c5.number_input("Seed", 0, 9999, 0, key="mech_seed"))
scaled = c6.toggle("Divide by √d_k", value=True, key="mech_scaled")
try:
    tokens, x = resources.mechanics_embeddings(sentence, d_model, source, seed)
    config = mechanics.LayerConfig(d_model, heads, d_head, scaled, seed)
except ValueError as error:
    widgets.show_error(error)
    st.stop()
st.caption(f"{len(tokens)} tokens from all-MiniLM-L6-v2's WordPiece tokenizer. X: "
           + ("its 384-wide word embeddings × a seeded random 384×D projection" if source == "minilm"
              else "a seeded random table, one row per vocabulary id")
           + ", each row LayerNorm'd; no positions added (a repeated word gets the same row). W_Q, W_K, W_V, W_O: "
           "seeded random with std 1/√D — a layer for reading, not a trained one.")
n, labels = len(tokens), charts.unique_labels(tokens)
share.restore(BY_LENGTH, {key: share.within(0 if key in ("mech_prefix", "mech_shift") else 1, n) for key in BY_LENGTH})
tab_steps, tab_masks, tab_cost = st.tabs(["① Step by step", "② Masks", "③ Cost"], key="mech_view", on_change="rerun")
stem_parts = (f"D {d_model}", f"H {heads}", f"dk {d_head}", "scaled" if scaled else "unscaled", f"seed {seed}")

with tab_masks:  # the mask is chosen here and used by the step-by-step tab too
    kind = st.radio("Mask", list(mechanics.MASK_KINDS), horizontal=True, key="mech_mask",
                    format_func=lambda k: mechanics.MASK_KINDS[k].title)
    st.caption(mechanics.MASK_KINDS[kind].used_by)
    p1, p2, p3 = st.columns(3)
    params = {}
    if kind == "padding":
        params["real_tokens"] = p1.slider("Real tokens (the rest are [PAD])", 1, n, max(1, n - n // 4), key="mech_real")
    elif kind == "prefix_lm":
        params["prefix"] = p1.slider("Prefix length", 0, n, n // 3, key="mech_prefix")
    elif kind in ("sliding_window", "global_local"):
        params["window"] = p1.slider("Window", 1, n, min(3, n), key="mech_window")
        if kind == "sliding_window":
            params["causal"] = p2.toggle("Causal", value=True, key="mech_window_causal")
        else:
            params["global_tokens"] = p2.multiselect("Global tokens", range(n), default=[0], key="mech_global",
                                                     format_func=lambda i: labels[i])
    elif kind == "strided":
        params["stride"] = p1.slider("Stride", 1, n, min(3, n), key="mech_stride")
    elif kind == "swin":
        rows, cols = p1.selectbox("Token grid (rows × cols)", mechanics.grid_shapes(n), key="mech_grid",
                                  format_func=lambda rc: f"{rc[0]} × {rc[1]}")
        windows = mechanics.common_windows(rows, cols) or [1]
        window = p2.selectbox("Window M", windows, key="mech_swin_m")
        share.restore(["mech_shift"], {"mech_shift": share.within(0, window - 1)})  # a link's shift fits its window
        shift = p3.slider("Shift s", 0, window - 1, window // 2, key="mech_shift") if window > 1 else 0
        if window == 1:
            st.info(f"No window M > 1 divides both sides of a {rows} × {cols} grid: pick another grid, or a sentence "
                    "whose token count has a square-ish factorisation (16 = 4 × 4, 12 = 2 × 6).")
        params.update(grid_rows=rows, window=window, shift=shift)
    try:
        allowed = mechanics.build_mask(kind, n, **params)
    except ValueError as error:
        widgets.show_error(error)
        allowed = mechanics.no_mask(n)
mask_value, mask_text = (-100.0, "−100") if kind == "swin" else (-np.inf, "−∞")
trace = mechanics.attention_layer(x, config, allowed=allowed, mask_value=mask_value, query_tokens=tokens)

with tab_steps:
    mode = st.radio("Attention", ["Self-attention", "Cross-attention"], horizontal=True, key="mech_mode")
    shown = trace
    if mode == "Cross-attention":
        other = st.text_input("Keys and values come from", "A tired dog stays at home.", key="mech_other")
        try:
            key_tokens, y = resources.mechanics_embeddings(other, d_model, source, seed)
        except ValueError as error:
            widgets.show_error(error)
            st.stop()
        shown = mechanics.attention_layer(x, config, x_key=y, query_tokens=tokens, key_tokens=key_tokens)
        st.caption("Queries from the sentence, keys and values from the other sequence (as a translation decoder reads "
                   "its encoder): the scores are N × M and no mask applies.")
    else:
        st.caption(f"Mask (chosen in the Masks tab): **{mechanics.MASK_KINDS[kind].title}**.")
    head = st.radio("Head shown", range(heads), horizontal=True, key="mech_head", format_func=lambda h: f"head {h}")
    steps = shown.steps()
    st.markdown("**The layer as four matrix multiplications** (①–④), with this sentence's shapes:")
    st.table({"step": [step.title for step in steps], "shape": [step.shape for step in steps]}, hide_index=True)
    everything = st.toggle("Show every step at once", value=False, key="mech_all_steps")
    first = [step.key for step in steps].index("q" if shown.cross else "qkv")
    chosen = steps if everything else [steps[st.select_slider(
        "Step", range(len(steps)), value=first, key="mech_step", format_func=lambda i: steps[i].title)]]
    axis = {"query": labels, "key": charts.unique_labels(shown.key_tokens),
            "qkv": [f"{p}{h}·{i}" for p in "QKV" for h in range(heads) for i in range(d_head)]}
    step_charts = []
    for step in chosen:
        value = step.value[head] if step.per_head else step.value
        st.markdown(f"#### {step.title}")
        st.latex(step.latex)
        st.caption(f"Shape: {step.shape}" + (f" — head {head} of {heads} shown" if step.per_head else ""))
        rows_l, cols_l = ([str(i) for i in range(size)] if what == "feature" else axis[what]
                          for what, size in ((step.rows, value.shape[0]), (step.cols, value.shape[1])))
        masked = ~shown.allowed if step.key == "masked_scores" else None
        big = np.abs(value[np.isfinite(value)]).max() >= 100
        chart = charts.matrix_chart(value, rows_l, cols_l, masked=masked, masked_text=mask_text,
                                    probabilities=step.key == "weights", decimals=1 if big else 2)
        st.altair_chart(chart, width="content")
        step_charts.append(chart.properties(title=step.title))  # the exported figure names its step
    share.downloads(
        export.file_stem("attention layer", *stem_parts, "cross" if shown.cross else kind,
                         "all steps" if everything else chosen[0].key, f"head {head}", sentence[:40]), "mech_steps",
        chart=step_charts[0] if len(step_charts) == 1 else lambda charts=tuple(step_charts): export.combined(
            *charts, vertical=True),
        payload={"sentence": sentence, "query_tokens": tokens, "key_tokens": shown.key_tokens, "mask": kind,
                 "head": head, **{step.key: step.value for step in steps}},
        arrays={step.key: step.value for step in steps},
        metadata={"input": sentence, "mask": kind, "settings": " ".join(stem_parts)})

    st.subheader("Why divide by √d_k")
    entropy = shown.row_entropy_bits()
    st.markdown(f"Mean softmax row entropy of this layer: **{entropy.mean():.2f} bits** (a uniform row over "
                f"{len(shown.key_tokens)} keys: {np.log2(len(shown.key_tokens)):.2f} bits). q·k sums d_k products, so "
                "its spread grows like √d_k: without the scaling the rows saturate towards one-hot and the softmax "
                "gradients vanish. Turn the toggle off and raise d_k to see it in the matrices above.")
    curve = resources.mechanics_entropy_curve(sentence, d_model, source, seed, heads)
    st.altair_chart(charts.entropy_chart(curve, current_d_k=d_head), width="content")

    st.subheader("Multi-head vs single head")
    single = mechanics.attention_layer(x, mechanics.LayerConfig(d_model, 1, heads * d_head, scaled, seed),
                                       allowed=allowed, mask_value=mask_value, query_tokens=tokens)
    st.caption(f"The same width H·d_k = {heads * d_head}, split into {heads} heads of {d_head} (each free to look "
               f"somewhere else) or kept as one head of {heads * d_head} (one pattern for everything). Colours run "
               "from 0 to each map's largest weight.")
    maps = [(trace.weights[h], f"head {h} of {heads}") for h in range(min(heads, 3))]
    maps.append((single.weights[0], "one head"))
    head_charts = []
    for i, (weights, title) in enumerate(maps):
        if i % 2 == 0:
            columns = st.columns(2)
        head_charts.append(charts.matrix_chart(weights, labels, labels, title, probabilities=True, width=380,
                                               annotate=False, colour_max=float(weights.max()),
                                               scheme=share.color_scheme()))
        columns[i % 2].altair_chart(head_charts[-1], width="content")
    share.downloads(export.file_stem("multi vs single head", *stem_parts, kind, sentence[:40]), "mech_multihead",
                    chart=lambda charts=tuple(head_charts): export.combined(
                        *(export.combined(*charts[i:i + 2]) for i in range(0, len(charts), 2)), vertical=True),
                    payload={"tokens": tokens, "heads": trace.weights, "one_head": single.weights[0]},
                    arrays={"heads": trace.weights, "one_head": single.weights[0]},
                    metadata={"input": sentence, "mask": kind, "settings": " ".join(stem_parts)})

with tab_masks:
    st.markdown(f"The same scores (head {head}) with {mask_text} where the mask hides a key, then the softmax: hidden "
                "keys get 0 and every row still sums to 1.")
    m1, m2 = st.columns(2)
    mask_charts = (charts.matrix_chart(trace.masked_scores[head], labels, labels, "scores + mask", masked=~allowed,
                                       masked_text=mask_text, width=380),
                   charts.matrix_chart(trace.weights[head], labels, labels, "softmax", probabilities=True, width=380,
                                       scheme=share.color_scheme()))
    m1.altair_chart(mask_charts[0], width="content")
    m2.altair_chart(mask_charts[1], width="content")
    share.downloads(export.file_stem("mask", kind, *(f"{k} {v}" for k, v in params.items()), f"head {head}",
                                     sentence[:40]), "mech_masks",
                    chart=lambda charts=mask_charts: export.combined(*charts),
                    table=lambda weights=trace.weights[head]: export.matrix_frame(weights, tokens, tokens),
                    payload={"tokens": tokens, "mask": kind, "settings": {k: str(v) for k, v in params.items()},
                             "allowed": allowed, "masked_scores": trace.masked_scores[head],
                             "weights": trace.weights[head]},
                    arrays={"allowed": allowed, "masked_scores": trace.masked_scores, "weights": trace.weights,
                            **{f"zoo {name}": pattern for name, pattern in mechanics.zoo(n).items()}},
                    metadata={"input": sentence, "mask": kind})
    if kind == "swin" and window > 1:
        st.markdown("**How Swin builds it:** roll the token grid by −s, number the regions the roll glued together "
                    "(slices 0:−M, −M:−s, −s:), and add −100 between different ids inside each M × M window.")
        rolled = np.roll(np.asarray(tokens, dtype=object).reshape(rows, cols), (-shift, -shift), axis=(0, 1))
        st.caption("The tokens after the cyclic shift, with Swin's region ids; thick lines: the M × M windows.")
        st.altair_chart(charts.swin_regions_chart(mechanics.swin_region_ids(rows, cols, window, shift), window,
                                                  rolled), width="content")
    st.markdown("#### The whole zoo on this sentence")
    gallery = st.columns(4)
    for i, (name, pattern) in enumerate(mechanics.zoo(n).items()):
        gallery[i % 4].altair_chart(charts.mask_chart(pattern, title=mechanics.MASK_KINDS[name].title, size=210),
                                    width="content")

@st.fragment
def cost_tab() -> None:
    """Its own fragment: the calculator's inputs rerun only this tab."""
    st.latex(r"\text{maps} = B\cdot L\cdot H\cdot N^2 \qquad \text{FlashAttention keeps } B\cdot L\cdot H\cdot N "
             r"\text{ float32 statistics}")
    k1, k2, k3, k4, k5 = st.columns(5)
    try:
        calc = cost.attention_cost(int(k1.number_input("Tokens N", 1, 10_000_000, 197, key="cost_n")),
                                   int(k2.number_input("Heads H", 1, 1024, 12, key="cost_h")),
                                   int(k3.number_input("Layers L", 1, 1024, 12, key="cost_l")),
                                   k4.selectbox("Precision", list(cost.DTYPE_BYTES), key="cost_dtype"),
                                   int(k5.number_input("Batch B", 1, 4096, 1, key="cost_b")))
    except ValueError as error:
        widgets.show_error(error)
        return
    b1, b2, b3 = st.columns(3)
    b1.metric("Entries per map (N²)", cost.thousands(calc.entries_per_map), cost.describe_bytes(calc.bytes_per_map),
              delta_color="off", delta_arrow="off")
    b2.metric("All maps (B·L·H·N²)", cost.binary_bytes(calc.bytes_all),
              f"{cost.thousands(calc.entries_all)} entries = {cost.decimal_bytes(calc.bytes_all)}",
              delta_color="off", delta_arrow="off")
    b3.metric("FlashAttention, O(N)", cost.binary_bytes(calc.flash_bytes_all),
              f"{cost.ratio_text(calc.bytes_all, calc.flash_bytes_all)} less", delta_color="off", delta_arrow="off")
    grid = np.unique(np.logspace(1, 6, 60).astype(int))
    curve = [cost.attention_cost(int(t), calc.heads, calc.layers, calc.dtype, calc.batch) for t in grid]
    memory = {"tokens": grid, "attention_map_bytes": np.array([c.bytes_all for c in curve]),
              "flash_bytes": np.array([c.flash_bytes_all for c in curve])}
    memory_chart = charts.memory_curve_chart(grid, memory["attention_map_bytes"], memory["flash_bytes"], 80e9,
                                             "one 80 GB GPU")
    st.altair_chart(memory_chart, width="content")
    share.downloads(export.file_stem("attention memory", f"H {calc.heads}", f"L {calc.layers}", calc.dtype,
                                     f"B {calc.batch}"), "cost_memory", chart=memory_chart,
                    table=pd.DataFrame(memory), arrays=memory)

    st.subheader("Worked examples (computed, not typed)")
    for example in cost.worked_examples():
        st.markdown(f"**{example.title}** — {example.setup}")
        st.latex(example.latex)
        st.table(cost.example_table(example), hide_index=True)
        st.caption(example.takeaway)

    st.subheader("KV cache: what generation keeps per token")
    st.latex(r"\text{MHA/GQA/MQA: } 2\cdot L\cdot H_{kv}\cdot d_{head}\cdot b \qquad \text{MLA: } L\cdot(d_c+d_h^R)"
             r"\cdot b \quad\text{bytes per token}")
    s1, s2 = st.columns(2)
    kv_tokens = int(s1.number_input("Sequence length", 1, 10_000_000, 4096, key="kv_tokens"))
    kv_dtype = s2.selectbox("Cache precision", list(cost.DTYPE_BYTES), index=1, key="kv_dtype")
    with st.spinner("Reading the models' configs…"):
        app_specs, published, skipped = resources.kv_cache_presets()
    specs = app_specs + published
    kv_chart = charts.kv_cache_chart([s.name for s in specs], [s.kind for s in specs],
                                     [s.bytes_per_sequence(kv_tokens, kv_dtype) for s in specs], kv_tokens)
    st.altair_chart(kv_chart, width="content")
    kv_rows = cost.kv_table(specs, kv_tokens, kv_dtype)
    st.table(kv_rows, hide_index=True)
    share.downloads(export.file_stem("kv cache", f"{kv_tokens} tokens", kv_dtype), "cost_kv", chart=kv_chart,
                    table=pd.DataFrame(kv_rows))
    for spec in (s for s in specs if s.kind == "MLA"):
        fewer = cost.ratio_text(spec.uncompressed_elements, spec.elements_per_token_per_layer)
        st.caption(f"{spec.name}: caching full K and V for its {spec.heads} heads would take "
                   f"{spec.uncompressed_elements:,} numbers per token and layer; MLA caches "
                   f"{spec.elements_per_token_per_layer:,} ({fewer} fewer).")
    if skipped:
        st.caption("Not read: " + "; ".join(skipped))
    share.publish(COST)


with tab_cost:
    cost_tab()
share.publish(SHARED + BY_LENGTH + ["mech_shift"])
