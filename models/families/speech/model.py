"""Speech recognition with Whisper (Radford et al. 2022): an encoder over 30 s of log-mel spectrogram, a decoder
that writes the transcript (or an English translation) while cross-attending to the audio frames.

- Loading: the Whisper models that ship on PyPI in CTranslate2's format (tiny.en, multilingual base in two parts)
  are converted once into transformers' ``WhisperForConditionalGeneration`` (``whisper_ct2.py``) and loaded
  with the capture attention function; hub ids (``openai/whisper-tiny``) load directly.
- Running: the encoder runs once under ``capture.recording`` (encoder self-attention, 1,500 frames of 20 ms); the
  language is detected from the decoder's first step when not given (multilingual models); greedy or beam decoding
  with the cached encoder states; then one teacher-forced decoder forward over the prompt and the produced tokens
  records decoder self-attention and cross-attention. Cross-attention row t is the decoder position that *produced*
  output token t, as on the translation page. Every row sums to 1 over all 1,500 frames, padding included: the
  figures crop to the frames that hold audio.
- Word timestamps from the alignment heads' cross-attention by dynamic time warping (``timing.py``), compared with
  CTranslate2's own ``align()``.
- Is it English? An English-only model's run asks the multilingual whisper-base (``language.py``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.core import audio as audio_lib
from models.core import capture, loading, memo, selection, text
from models.core.inputs import AudioInput
from models.core.loading import LoadedModel, Progress
from models.core.results import GenerationStep, RunResult
from models.core.specs import ModelSpec
from models.families.speech import whisper_ct2
from models.families.speech.language import (
    LanguageCheck,
    check_language,
    not_english_notice,
)
from models.families.speech.timing import (  # noqa: F401
    MEDIAN_WIDTH,
    NO_SPACE_LANGUAGES,
    Word,
    alignment_matrix,
    dtw_path,
    word_timings,
)

TASKS = ("transcribe", "translate")
STRATEGIES = ("greedy", "beam search")
AUTO = "auto"

@dataclass(frozen=True)
class SpeechSettings:
    task: str = "transcribe"  # or "translate" (into English; multilingual models only)
    language: str = AUTO  # a code such as "en", "fr"; "auto": detected from the audio
    strategy: str = "greedy"
    num_beams: int = 4  # beam search only
    max_new_tokens: int = 128
    candidates: int = 5  # next-token candidates kept per step
    check_language: bool = True  # English-only models: ask the multilingual whisper-base whether it is English

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

def converted_folder(spec: ModelSpec, progress: Progress = loading._no_progress) -> Path:
    """The packaged CTranslate2 Whisper converted once (about 10 s) into a transformers folder in the local cache."""
    source = whisper_ct2.ct2_folder(spec, progress)

    def build(folder: Path) -> None:
        config = json.loads((source / "config.json").read_text())
        whisper_ct2.convert((source / "model.bin").read_bytes(), config, source / "tokenizer.json", folder)

    stamp = {"from": spec.id, "bytes": (source / "model.bin").stat().st_size, "version": whisper_ct2.CONVERSION_VERSION}
    return loading.converted_once(f"{spec.id}-transformers", stamp, build, progress,
                                  "First run: converting the packaged Whisper to transformers (once, ~10 s)")


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = loading._no_progress) -> LoadedModel:
    import transformers

    source = None
    if spec.source == "package":
        if spec.id not in whisper_ct2.PACKAGES:
            raise ValueError(f"no loader for the packaged speech model {spec.id!r}")
        progress("Preparing the packaged weights", 0.05)
        source = converted_folder(spec, progress)

    def whisper_only(config) -> None:
        if getattr(config, "model_type", "") != "whisper":
            raise ValueError(f"'{spec.id}' is a {getattr(config, 'model_type', 'unknown')} model; this page reads "
                             "Whisper models (openai/whisper-tiny … openai/whisper-large-v3-turbo, .en models and "
                             "fine-tunes of them). A language model reading audio (Qwen2-Audio, "
                             "Voxtral, Granite Speech) shows its text decoder on the GPT page; "
                             "docs/MODELS.md lists what each page reads.")

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


_VOCABULARIES: "memo.PerObject[WhisperVocabulary]" = memo.PerObject()  # per tokenizer, for its lifetime


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
    vocab_size = loaded.model.config.vocab_size
    return _VOCABULARIES.get(loaded.tokenizer, lambda: _vocabulary_of(loaded.tokenizer, vocab_size), vocab_size)


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
    language_check: LanguageCheck | None = None  # English-only models: is the clip English? (``check_language``)


@dataclass(frozen=True, kw_only=True)
class SpeechResult(RunResult):
    """Whisper on one clip: ``tokens`` are the encoder frames (labels in seconds); ``attention`` has ``encoder``
    (frames × frames), ``decoder`` (decoder inputs) and ``cross`` (output tokens × frames)."""

    output: SpeechOutput
    mel: np.ndarray  # (mel bins, 3000) log-mel spectrogram the encoder read (10 ms frames; 80 or 128 bins)
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
    mel = audio_lib.log_mel(clip.samples, model.config.num_mel_bins)  # 80 bins; 128 for large-v3 and its turbo
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
    audio_frames = audio_lib.content_frames(clip.samples)
    checked = None
    if settings.check_language and not vocab.multilingual:
        try:
            heard = mel if mel.shape[0] == audio_lib.N_MELS else audio_lib.log_mel(clip.samples)  # whisper-base's
            checked = check_language(heard, audio_frames)
        except (ValueError, ImportError, RuntimeError) as error:  # the multilingual package is not installed
            notices.append(f"Could not check that the clip is English ({error}).")
        if checked is not None and not checked.english:
            notices.append(not_english_notice(loaded.spec.key, checked))
    output = SpeechOutput(tokenizer.decode(produced, skip_special_tokens=True).strip(), prompt,
                          _display(tokenizer, prompt), produced, output_tokens, decoder_tokens, settings.task,
                          language, detected, probabilities, settings.strategy,
                          settings.num_beams if settings.strategy == "beam search" else 1, checked)
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



def cross_attention(result: SpeechResult, layer=selection.ALL, head=selection.NAMED) -> tuple[np.ndarray, str]:
    """``(output tokens, 1500 frames)`` cross-attention and its description, for a layer and a head as
    ``models.core.selection`` chooses them: the model's alignment heads averaged (``NAMED``), every head of every
    layer (``ALL``, ``MEAN``), one head of every layer, a layer's heads, or one head."""
    maps = result.maps("cross")
    if head == selection.NAMED:
        chosen = result.alignment_heads
        described = f"mean of the {len(chosen)} alignment heads"
    elif layer == selection.ALL:
        index = selection.head_index(head, maps.num_heads)
        heads = range(maps.num_heads) if index is None else (index,)
        chosen = tuple((i, h) for i in range(maps.num_layers) for h in heads)
        described = f"mean of all {len(chosen)} heads" if index is None else f"head {index} of every layer (mean)"
    else:
        index, one = selection.pick(maps, layer, head)
        return maps.head(index, one), f"layer {index}, {selection.head_label(selection.head_choice(one))}"
    by_layer: dict[int, list[int]] = {}
    for i, h in chosen:
        by_layer.setdefault(i, []).append(h)
    total = sum(maps.layer(i)[hs].sum(axis=0) for i, hs in by_layer.items())
    return (total / len(chosen)).astype(np.float32), described


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
