"""The support matrix: a tiny random model of every attention architecture transformers' auto mappings list, saved
to a folder, typed into its page's model picker (the page's own load and run), and every map compared with the same
folder run by transformers' eager attention (``output_attentions=True``).

    python -m tests.support_matrix --write           # run every architecture, write docs/MODELS.md and the
                                                     # expectations tests/data/support_matrix.json
    python -m tests.support_matrix llama gemma2      # a few, printed

Outcomes: ``exact`` (the capture path, every map within ``TOLERANCE`` of eager), ``exact (eager path)`` (the model's
attention does not pass through transformers' AttentionInterface; its own eager maps are read), ``refused`` (a
message in words, before the run), ``wrong`` and ``crash`` (both failures), and ``not built`` (this harness could not
make a tiny model of it: the architecture is listed with the reason, not counted).
"""
from __future__ import annotations

import copy
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EXPECTED = ROOT / "tests" / "data" / "support_matrix.json"
DOC = ROOT / "docs" / "MODELS.md"
TOLERANCE = 1e-5  # float32 maps against eager
LOG_TOLERANCE = 1e-4  # next-token log-probabilities against eager (a 30k vocabulary's probabilities are ~3e-5)
TEXT = "The cat sat on the mat because it was tired and the dog was not"
VOCAB = 30522  # the packaged MiniLM tokenizer's, so that real text tokenises
MAX_PARAMETERS = 20_000_000  # a config this harness failed to shrink is reported, not built

# each page and the transformers auto mapping whose architectures a user would type into it
PAGES = {
    "causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "encoder": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "translation": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
}
PAGE_TITLES = {"causal_lm": "Language model (GPT)", "encoder": "Encoder (BERT)", "translation": "Translation",
               "vit": "Vision Transformer", "swin": "Swin Transformer", "speech": "Speech (Whisper)",
               "moe": "Mixture of experts"}
KINDS = {"causal_lm": ("self",), "encoder": ("self",), "translation": ("encoder", "decoder", "cross")}

# sizes every tiny model gets, by the names configs use for them
SIZES = {
    64: ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim", "n_embed", "hidden_dim",
         "embedding_size", "emb_dim", "word_embed_proj_dim", "input_embedding_size", "output_embedding_size",
         "hidden_size_per_layer_input"),
    2: ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "encoder_layers",
        "decoder_layers", "num_experts_per_tok", "top_k", "moe_topk", "num_experts_per_token", "moe_k"),
    4: ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
        "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "sliding_window",
        "attention_window"),
    8: ("rotary_dim", "rotary_emb_base_dim"),
    16: ("head_dim", "d_kv", "d_head", "kv_channels", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank",
         "mamba_dt_rank", "time_step_rank", "attention_head_dim"),
    32: ("q_lora_rank", "moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"),
    128: ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim", "ffn_hidden_size",
          "ff_dim", "intermediate_dim"),
}
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length")
DROPPED = ("architectures", "torch_dtype", "dtype", "_name_or_path", "transformers_version",
           "model_type", "auto_map")


LAYER_COUNTS = SIZES[2][:7]  # the names of a config's layer count
KEEP_LAYERS = 4  # at most this many layers, chosen so that every kind of layer the model has is kept


def _layer_choice(values: dict) -> list[int] | None:
    """Which of the default config's layers a tiny model keeps: the first of each distinct kind (by every
    per-layer list of names or flags: attention/linear/Mamba, sliding/full, dense/MoE), at least two, at most
    ``KEEP_LAYERS``; None when the config has no layer count."""
    count = next((values[n] for n in LAYER_COUNTS if isinstance(values.get(n), int) and values[n] > 0), None)
    if count is None:
        return None
    kinds = [v for n, v in values.items() if isinstance(v, (list, str)) and len(v) == count and n != "model_type"
             and all(isinstance(x, (str, bool)) for x in v)]
    chosen: list[int] = []
    seen = set()
    for index in range(count):
        signature = tuple(kind[index] for kind in kinds)
        if signature not in seen:
            seen.add(signature)
            chosen.append(index)
    for index in range(count):  # at least two layers (a stream through more than one block)
        if len(chosen) >= 2:
            break
        if index not in chosen:
            chosen.append(index)
    return sorted(chosen)[:KEEP_LAYERS]


def _shrunk(values: dict, layers: list[int] | None = None) -> dict:
    """A config dict with every size this harness knows set small and its per-layer entries cut to ``layers``
    (sub-configs too)."""
    out = {}
    chosen = _layer_choice(values) if layers is None else layers
    count = next((values[n] for n in LAYER_COUNTS if isinstance(values.get(n), int) and values[n] > 0), None)
    for name, value in values.items():
        if name in DROPPED:
            continue
        if isinstance(value, dict) and name.endswith("config"):
            out[name] = _shrunk(value)
            continue
        if chosen is not None and count and isinstance(value, (list, str)) and len(value) == count and \
                name not in ("model_type",) and not name.endswith("token_id"):
            picked = [value[i] for i in chosen]
            out[name] = "".join(picked) if isinstance(value, str) else picked
            if all(isinstance(x, int) and not isinstance(x, bool) for x in picked):
                out[name] = [_small(name, x) for x in picked]
            continue
        if chosen is not None and isinstance(value, dict) and value and \
                all(str(k).lstrip("-").isdigit() for k in value):  # per-layer settings by layer index
            out[name] = {str(chosen.index(int(k))) if isinstance(k, str) else chosen.index(int(k)): v
                         for k, v in value.items() if int(k) in chosen}
            continue
        if isinstance(value, bool) or value is None:
            out[name] = value
            continue
        if name in LAYER_COUNTS and isinstance(value, int) and chosen is not None and value == count:
            out[name] = len(chosen)
            continue
        out[name] = _small(name, value)
    if "qk_head_dim" in out and "qk_nope_head_dim" in out and "qk_rope_head_dim" in out:
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]  # MLA: derived, keep consistent
    if "kv_lora_rank" in out:  # MLA expands its compressed keys to every query head
        for name in KV_HEADS:
            if name in out:
                out[name] = out.get("num_attention_heads", 4)
    for name in ("n_group", "topk_group"):  # expert groups: the tiny model's 4 experts are one group
        if isinstance(out.get(name), int):
            out[name] = 1
    return out


def _small(name: str, value):
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    for size, names in SIZES.items():
        if name in names:
            return size
    if name in KV_HEADS:
        return 2
    if name in POSITIONS:
        return min(value, 512)
    if name == "vocab_size":
        return VOCAB
    if name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id") and value >= VOCAB:
        return 0
    return value


def tiny_config(model_type: str):
    """A seeded tiny config of ``model_type``: 2 layers, 4 heads (2 key/value heads where grouped), d = 64."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    values = _shrunk(config_class().to_dict())
    _override(values, OVERRIDES.get(model_type, {}))
    if values.get("is_encoder_decoder") and values.get("decoder_start_token_id") is None and \
            values.get("bos_token_id") is None:
        values["decoder_start_token_id"] = 0  # T5's convention (its published configs say so; its class does not)
    return config_class(**values)


def _override(values: dict, changes: dict) -> None:
    """``changes`` into ``values``; a sub-config's override changes only what it names."""
    for name, value in changes.items():
        if isinstance(value, dict) and isinstance(values.get(name), dict):
            _override(values[name], value)
        else:
            values[name] = value


# where the generic shrinking is not enough (a tiny model of that architecture needs these)
OVERRIDES: dict[str, dict] = {
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "recurrent_gemma": {"num_hidden_layers": 3},  # its block pattern repeats every three layers
    "deepseek_v2": {"num_experts_per_tok": 2},  # None by default: routing needs it
    "fun_asr_nano": {"adaptor_config": {"intermediate_size": 16}},  # must be the text width // 4
    # their audio tokenizers double 32 filters at each of six stages: 2,048 channels, 340 M weights
    **{name: {f"{part}_config": {"num_filters": 2, "depths": [1] * 7} for part in parts}
       for name, parts in (
           ("vibevoice_asr", ("acoustic_tokenizer_encoder", "semantic_tokenizer_encoder")),
           ("vibevoice", ("audio", "semantic_model")))},
}


@dataclass
class Outcome:
    page: str
    model_type: str
    architecture: str = ""
    status: str = "not built"  # exact | exact (eager path) | refused | wrong | crash | not built
    path: str = ""  # how the page drew it (capture description)
    max_difference: float | None = None
    next_token_difference: float | None = None
    layers: int = 0
    message: str = ""
    seconds: float = 0.0
    kinds: list[str] = field(default_factory=list)
    lens: str = ""  # the logit lens on the page's run: "exact" (its output row is the model's), or its refusal


# The pages that refuse a model reading audio beside its text (translation: no cross-attention;
# speech: not Whisper) send its user to the GPT page, which runs its text decoder alone
# (models/families/causal_lm/model.model_class): those architectures are checked there too.
WITH_TEXT = ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
             "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES")


@functools.cache  # every architecture's config made once, not once per lookup
def _text_decoders() -> dict[str, str]:
    """{model type: the class the GPT page builds} for the ``WITH_TEXT`` models whose text decoder
    it draws."""
    import transformers
    from transformers.models.auto import modeling_auto

    from models.families.causal_lm import model as causal_lm

    found = {}
    causal = getattr(modeling_auto, PAGES["causal_lm"])
    listed = {t for mapping in WITH_TEXT for t in getattr(modeling_auto, mapping)}
    for model_type in sorted(listed - set(causal)):
        try:
            config = transformers.AutoConfig.for_model(model_type)
        except Exception:  # noqa: BLE001 - a type without a config of its own
            continue
        chosen = causal_lm.model_class(config)
        if chosen is not transformers.AutoModelForCausalLM:
            found[model_type] = chosen.__name__
    return found


def _model_class(page: str, model_type: str):
    import transformers
    from transformers.models.auto import modeling_auto

    names = getattr(modeling_auto, PAGES[page])
    borrowed = page == "causal_lm" and model_type not in names
    name = _text_decoders()[model_type] if borrowed else names[model_type]
    name = name[0] if isinstance(name, (list, tuple)) else name
    return getattr(transformers, name, None), name


def build(page: str, model_type: str, folder: Path) -> str:
    """Save a seeded tiny random model of ``model_type`` (as the page's auto class builds it) and the MiniLM tokenizer
    to ``folder``, as a user saves theirs; returns the model class name."""
    from tests.conftest import minilm_tokenizer

    config = tiny_config(model_type)
    model_class, name = _model_class(page, model_type)
    if model_class is None:
        raise LookupError(f"transformers has no class {name}")
    with torch.device("meta"):
        meta = model_class._from_config(copy.deepcopy(config))
    parameters = sum(p.numel() for p in meta.parameters())
    if parameters > MAX_PARAMETERS:
        raise LookupError(f"{parameters / 1e6:.0f} M parameters after shrinking (the harness missed a size)")
    torch.manual_seed(0)
    model = model_class._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    ids = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102]])
    extra = {"decoder_input_ids": ids[:, :3]} if getattr(config, "is_encoder_decoder", False) else {}
    try:  # the tiny model must run as transformers made it, or it is this harness's fault
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False, **extra)
    except Exception as error:
        raise LookupError(f"the tiny model does not run in eager: {type(error).__name__}: "
                          f"{str(error).splitlines()[0][:160] if str(error) else ''}") from error
    model.save_pretrained(folder)
    minilm_tokenizer().save_pretrained(folder)
    return name


def _log_difference(drawn: np.ndarray, expected: np.ndarray) -> float:
    """The largest difference of log-probabilities (what the page's probabilities say, at any size)."""
    floor = 1e-30
    return float(np.abs(np.log(np.maximum(drawn, floor)) - np.log(np.maximum(expected, floor))).max())


def _softmax_maps(attentions, banded: bool = False) -> dict[int, np.ndarray]:
    from models.core import capture

    return {number: (capture._unband(a) if banded else a)[0].float().numpy()
            for number, a in enumerate(attentions or ()) if isinstance(a, torch.Tensor) and a.dim() == 4}


def _eager(page: str, folder: Path, ids: list[int], decoder_ids: list[int] | None = None):
    """(kind -> {layer: map (heads, q, k) float32}, next-token probabilities or None) from transformers' own eager
    attention on the same folder and ids (and, for an encoder–decoder, the decoder's input ids)."""
    import transformers

    from models.core import capture
    from models.families.causal_lm import model as causal_lm

    auto = {"causal_lm": causal_lm.model_class(transformers.AutoConfig.from_pretrained(folder)),
            "translation": transformers.AutoModelForSeq2SeqLM}.get(page, transformers.AutoModel)
    model = auto.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    input_ids = torch.tensor([ids])
    extra = {} if decoder_ids is None else {"decoder_input_ids": torch.tensor([decoder_ids])}
    with torch.inference_mode():
        output = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), output_attentions=True,
                       use_cache=False, **extra)
    banded = model.config.model_type in ("longformer", "led")  # rows of a window of keys (capture._unband)
    if model.config.model_type == "squeezebert":  # its eager "attentions" are the scores before the softmax
        output.attentions = tuple(torch.softmax(a, -1) for a in output.attentions)
    if page == "translation":
        encoder = output.encoder_attentions
        if model.config.model_type in capture.BLOCKED:  # LongT5's local blocks, as (q, k)
            length = output.encoder_last_hidden_state.shape[1]
            encoder = [capture._unblock(a, length) for a in encoder]
        maps = {"encoder": _softmax_maps(encoder, banded),
                "decoder": _softmax_maps(output.decoder_attentions),
                "cross": _softmax_maps(output.cross_attentions)}
        return maps, torch.softmax(output.logits[0].float(), -1).numpy()
    attentions = getattr(output, "encoder_attentions", None) or output.attentions  # an encoder–decoder's encoder
    maps = {n: m for n, m in _softmax_maps(attentions, banded).items() if m.shape[-1] == len(ids)}
    probabilities = None
    if page == "causal_lm":
        probabilities = torch.softmax(output.logits[0, -1].float(), -1).numpy()
    return {"self": maps}, probabilities


def _worst(maps, reference: dict[int, np.ndarray]) -> float:
    """The largest difference between drawn maps and eager's, layer by layer (eager's attentions of a hybrid
    list its attention layers only, in order); an ``AssertionError`` when they do not pair up."""
    numbers = [maps.layer_number(layer) for layer in range(maps.num_layers)]
    if len(reference) == len(numbers) and sorted(reference) != numbers:
        reference = dict(zip(numbers, (reference[n] for n in sorted(reference))))
    if sorted(reference) != numbers:
        raise AssertionError(f"layers {numbers} drawn, eager returned maps of layers {sorted(reference)}")
    worst = 0.0
    for layer, number in enumerate(numbers):
        expected, drawn = reference[number], maps.layer(layer)
        if drawn.shape != expected.shape:
            raise AssertionError(f"layer {number}: drawn {drawn.shape}, eager {expected.shape}")
        difference = float(np.abs(drawn - expected).max())
        if maps.sink_share(layer, 0) is not None:
            # some eager implementations (Granite SWA) return the weights before the sink takes its share and
            # scale the output instead: the same map up to each row's sink share
            total = drawn.sum(-1, keepdims=True)
            difference = min(difference, float(np.abs(drawn / np.where(total > 0, total, 1) - expected).max()))
        worst = max(worst, difference)
    return worst


def check(page: str, model_type: str, workdir: Path) -> Outcome:
    """Build, load through the page's path, run, compare with eager."""
    from models import families
    from models.core.inputs import TextInput

    outcome = Outcome(page, model_type)
    started = time.perf_counter()
    folder = workdir / f"{page}-{model_type}"
    try:
        outcome.architecture = build(page, model_type, folder)
    except Exception as error:  # noqa: BLE001 - the harness's own failure, reported as "not built"
        outcome.message = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        outcome.seconds = time.perf_counter() - started
        return outcome
    try:
        spec = families.custom(page, str(folder))
        loaded = families.load(spec, "cpu", "float32")
        result = families.run(loaded, TextInput(TEXT, 64))
        outcome.path = loaded.capture
        outcome.kinds = list(result.attention)
    except ValueError as error:
        outcome.status = "refused"
        outcome.message = str(error)
        outcome.seconds = time.perf_counter() - started
        return outcome
    except Exception as error:  # noqa: BLE001 - a crash is what the matrix exists to find
        outcome.status = "crash"
        outcome.message = f"{type(error).__name__}: {error}"[:500] + "\n" + traceback.format_exc(limit=-3)[-1500:]
        outcome.seconds = time.perf_counter() - started
        return outcome
    try:
        if page == "translation":
            output = result.output
            decoder_ids = [output_start(result)] + list(output.output_ids[:-1])
            reference, probabilities = _eager(page, folder, list(output.source_ids), decoder_ids)
            if probabilities is not None and result.generation:  # each step's chosen token, as eager gives it
                drawn = np.array([step.probability for step in result.generation])
                expected = probabilities[np.arange(len(output.output_ids)), list(output.output_ids)]
                outcome.next_token_difference = _log_difference(drawn, expected)
        else:
            reference, probabilities = _eager(page, folder, list(result.token_ids))
            if probabilities is not None and result.next_token:
                drawn = np.array([t.probability for t in result.next_token])
                expected = probabilities[[t.token_id for t in result.next_token]]
                outcome.next_token_difference = _log_difference(drawn, expected)
        worst = 0.0
        for kind in KINDS[page]:
            maps = result.attention[kind]
            outcome.layers = max(outcome.layers, maps.num_layers)
            worst = max(worst, _worst(maps, reference[kind]))
        outcome.max_difference = worst
        if page == "causal_lm":
            outcome.lens = _lens(loaded, result)
        exact = worst <= TOLERANCE and (outcome.next_token_difference or 0.0) <= LOG_TOLERANCE
        eager_path = loaded.capture == _eager_description()
        outcome.status = ("exact (eager path)" if eager_path else "exact") if exact else "wrong"
    except Exception as error:  # noqa: BLE001
        outcome.status = "wrong"
        outcome.message = f"compared with eager: {type(error).__name__}: {error}"[:500]
    outcome.seconds = time.perf_counter() - started
    return outcome


def output_start(result) -> int:
    """The decoder's first input id of a translation (the page keeps its label, START_LABEL; the model's
    generation config says which id it was)."""
    return int(result.output.decoder_start_id)


def _eager_description() -> str:
    from models.core import capture

    return capture.EAGER_PATH_DESCRIPTION


def _lens(loaded, result) -> str:
    """The logit lens through the page's own analysis: its last layer at the last position must be the model's
    own next-token distribution (the named sites are where the model's residual stream is)."""
    from types import SimpleNamespace

    from models.analysis import lens

    try:
        found = lens.logit_lens(loaded, result, SimpleNamespace(last=-1, positions=4))
    except ValueError as error:
        return f"refused: {error}"
    best = result.next_token[0]
    if int(found.top_ids[-1, -1, 0]) != best.token_id or abs(float(found.top_probs[-1, -1, 0]) - best.probability) \
            > 1e-4:
        return "wrong"
    return "exact"


# pages whose checks live in a module of their own: page -> module with ``architectures(page) -> list[str]`` and
# ``check(page, model_type, workdir) -> Outcome`` (the same contract as this module's)
OTHER_PAGES = {"speech": "tests.matrix_speech", "moe": "tests.matrix_moe", "vit": "tests.matrix_vision",
               "swin": "tests.matrix_vision"}


def _module_of(page: str):
    """This module for its own pages, else the page's module (None when it does not exist yet)."""
    import importlib

    if page in PAGES:
        return sys.modules[__name__]
    try:
        return importlib.import_module(OTHER_PAGES[page])
    except ModuleNotFoundError:
        return None


def all_pages() -> tuple[str, ...]:
    return tuple(PAGES) + tuple(page for page in OTHER_PAGES if _module_of(page) is not None)


def architectures(page: str) -> list[str]:
    from transformers.models.auto import modeling_auto

    if page not in PAGES:
        return _module_of(page).architectures(page)
    borrowed = set(_text_decoders()) if page == "causal_lm" else set()
    return sorted(set(getattr(modeling_auto, PAGES[page])) | borrowed)


def quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def run_all(pages: tuple[str, ...] | None = None, only: list[str] | None = None, log=print) -> list[Outcome]:
    torch.set_num_threads(1)
    quiet()
    pages = pages or all_pages()
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        os.environ["ATTN_EXPLORER_MODEL_DIRS"] = str(workdir)
        for page in pages:
            for model_type in architectures(page):
                if only and model_type not in only:
                    continue
                outcome = _module_of(page).check(page, model_type, workdir)
                outcome.message = outcome.message.replace(f"{workdir}{os.sep}", "")  # as the user typed it
                outcomes.append(outcome)
                log(f"{page:10s} {model_type:28s} {outcome.status:20s} {outcome.lens[:8]:8s} {outcome.seconds:5.1f}s "
                    f"{'' if outcome.max_difference is None else f'{outcome.max_difference:.1e}'} "
                    f"{outcome.message.splitlines()[0][:140] if outcome.message else ''}")
    return outcomes


COVERED = ("exact", "exact (eager path)", "refused")
FAILED = ("wrong", "crash")
# what a refusal must never show: a library's insides instead of words a user can act on
NOT_WORDS = ("Traceback", "<class ", "object has no attribute", "KeyError", "IndexError", "NoneType",
             "StrictDataclass", "site-packages")
WHAT_EACH_PATH_DRAWS = {
    "exact": "every view, at any length (q and k kept, maps recomputed where they live)",
    "exact (eager path)": "every view that needs whole maps; not the long-input reductions, knockout or the "
                          "explanations that differentiate through attention",
}


# refusals that say the architecture has no attention map at all (convolutions, pooling, state-space layers): the
# issue counts the architectures "that have attention", so these are listed apart, not counted as refused
NO_ATTENTION = ("has no attention to draw", "not softmax attention", "no attention weights reach",
                "gives no query × key map", "which gives no query", "gave no attention map at all")


def has_attention(outcome: Outcome) -> bool:
    return not (outcome.status == "refused" and any(words in outcome.message for words in NO_ATTENTION))


def summary(outcomes: list[Outcome]) -> dict:
    """Counts over distinct architectures that have attention (an architecture on two pages counts once, by its
    best outcome)."""
    without = {o.model_type for o in outcomes if not has_attention(o)}
    outcomes = [o for o in outcomes if o.model_type not in without or has_attention(o) and o.status != "refused"]
    rank = {"exact": 0, "exact (eager path)": 1, "refused": 2, "not built": 3, "wrong": 4, "crash": 5}
    best: dict[str, str] = {}
    for outcome in outcomes:
        name = outcome.model_type.split("-")[0] if outcome.page == "speech" else outcome.model_type  # sizes: one
        current = best.get(name)
        if current is None or rank[outcome.status] < rank[current]:
            best[name] = outcome.status
    covered = [t for t, status in best.items() if status in COVERED]
    drawn = [t for t in covered if best[t] != "refused"]
    return {"architectures": len(best), "covered": len(covered), "drawn": len(drawn),
            "drawn_share": len(drawn) / max(1, len(covered)), "without_attention": sorted(without - set(best)),
            "failed": sorted(f"{o.page}:{o.model_type}" for o in outcomes if o.status in FAILED)}


def render(outcomes: list[Outcome]) -> str:
    """docs/MODELS.md: the table a user reads before typing a model into a page."""
    import transformers

    counts = summary(outcomes)
    lines = [
        "# Which architectures each page draws",
        "",
        f"Generated by `python -m tests.support_matrix --write` with transformers {transformers.__version__} "
        f"and PyTorch {torch.__version__.split('+')[0]}; `tests/test_support_matrix.py` runs the same checks in CI.",
        "",
        "Each row is a tiny random model of the architecture (seeded, two to four layers), saved to a folder the way "
        "a user saves theirs, typed into the page's model picker and run through the page's own code; every map "
        "is compared with the same folder run by transformers' eager attention (`output_attentions=True`), and the "
        "next-token log-probabilities with eager's. The model's real weights do not change any of this.",
        "",
        f"**{counts['covered']} architectures with attention** are drawn exactly or refused in words; "
        f"{counts['drawn']} of them ({counts['drawn_share']:.0%}) are drawn exactly. Wrong or crashing: "
        f"{len(counts['failed'])}. Refused because they have no attention map at all (convolutions, pooling, "
        f"state-space or linear layers): {', '.join(counts['without_attention'])}.",
        "",
        "- **exact**: the capture path: " + WHAT_EACH_PATH_DRAWS["exact"] + ".",
        "- **exact (eager path)**: the architecture's attention does not pass through transformers' "
        "AttentionInterface (or its SDPA path is not what its eager path computes), so the page reads its own "
        "eager attention: " + WHAT_EACH_PATH_DRAWS["exact (eager path)"] + ".",
        "- **refused**: the page says why, in these words, before it draws anything.",
        "- **lens** (language-model page): the logit lens, patching and ablation read the residual stream at sites "
        "checked against the model's own hidden states; where they are not, they are refused in words.",
        "- Models that read audio beside their text (Qwen2-Audio, Voxtral, Granite Speech, ...) are "
        "rows of the language-model page too: it runs their text decoder on text alone and says so; "
        "their audio encoder is not drawn.",
        "- Not in the table: architectures this harness could not build a tiny model of (listed at the end); a "
        "real checkpoint of them may well work.",
        "",
    ]
    for page in dict.fromkeys(o.page for o in outcomes):
        rows = [o for o in outcomes if o.page == page and o.status != "not built"]
        title = PAGE_TITLES.get(page, page)
        lines += [f"## {title} (`--page {page}`)", "",
                  "| architecture | class | outcome | largest difference | " +
                  ("lens | " if page == "causal_lm" else "") + "note |",
                  "|---|---|---|---|" + ("---|" if page == "causal_lm" else "") + "---|"]
        for o in rows:
            difference = "" if o.max_difference is None else f"{o.max_difference:.0e}"
            note = o.message.splitlines()[0].replace("|", "/") if o.message else ""
            lens = ""
            if page == "causal_lm":
                lens = {"exact": "yes", "": ""}.get(o.lens, "no") + " | "
                if o.lens.startswith("refused: ") and not note:
                    note = "lens: " + o.lens.removeprefix("refused: ").split(": ", 1)[-1]
            lines.append(f"| {o.model_type} | {o.architecture} | {o.status} | {difference} | {lens}{note[:200]} |")
        lines.append("")
    skipped = sorted({o.model_type for o in outcomes if o.status == "not built"})
    lines += ["## Not built by this harness", "",
              "The generic shrinking of a default config did not give a runnable tiny model of: "
              + ", ".join(skipped) + ".", ""]
    import textwrap

    wrapped = [line if line.startswith("|") else textwrap.fill(line, 100, subsequent_indent="  " if
                                                                line.startswith("- ") else "") or line
               for line in lines]
    return "\n".join(wrapped)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    write = "--write" in arguments
    pages = tuple(a.removeprefix("--page=") for a in arguments if a.startswith("--page="))
    names = [a for a in arguments if not a.startswith("--")]
    results = run_all(pages or None, only=names or None)
    if write:
        EXPECTED.parent.mkdir(parents=True, exist_ok=True)
        EXPECTED.write_text(json.dumps({o.page + ":" + o.model_type: o.status for o in results}, indent=0,
                                       sort_keys=True) + "\n")
        DOC.write_text(render(results))
        print(summary(results))
