"""Encoder–decoder translation: decode, then read the cross-attention alignment (Bahdanau et al. 2015, fig. 3).

- Decoding: greedy or beam search. Transformers use ``model.generate``; the project's GRU translators decode here.
- Attention: one teacher-forced forward over the final output (the chosen hypothesis, whichever search found it)
  records, through the capture engine (``models.core.capture``), the encoder self-attention, the decoder masked
  self-attention and the cross-attention of every layer and head. Cross-attention row t is the decoder position
  that *produced* output token t (its input is token t − 1), so rows are labelled with the produced tokens, as in
  Bahdanau et al.'s figure. The GRU with additive attention reports its weights a_t itself (one layer, one head);
  the fixed-context GRU has no attention to show.
- Step-through: at output step t, the model's distribution over the next token (top candidates) and the token that
  was chosen, from the same forward pass.
- Words from subwords (``models.analysis.alignment``): attention summed over a source word's pieces and averaged
  over a target word's pieces.
- Gold: when the source is one of the page's grammar samples, the result carries the grammar's reference and, when
  the output matches it word for word, its gold links, so a figure can draw them and score the argmax links by
  alignment error rate (Och & Ney 2003).
"""
from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from models.analysis import alignment
from models.core import capture, decoding, loading, text
from models.core.inputs import TextInput
from models.core.loading import SAMPLE_DATA, LoadedModel, Progress, text_out_of_memory
from models.core.results import (
    AttentionMaps,
    GenerationStep,
    RunResult,
    StoredAttention,
)
from models.core.specs import ModelSpec

STRATEGIES = ("greedy", "beam search")
DEFAULT_MAX_SOURCE_TOKENS = 128  # the page's source token limit: longer sentences are refused with a message
START_LABEL = "⟨start⟩"
GRU_CAPTURE = "the model's own additive-attention weights a_t (returned by its forward pass)"
NO_ATTENTION = "none: a fixed context vector, no attention"
METRICS = SAMPLE_DATA / "translation" / "metrics.json"  # the minis' measured quality (their trainer writes it)
MODEL_CARD = SAMPLE_DATA / "translation" / "card.md"  # the minis' card, written from the metrics


@dataclass(frozen=True)
class TranslationSettings:
    strategy: str = "greedy"
    num_beams: int = 4  # beam search only
    max_new_tokens: int = 0  # 0: twice the source length + 10, capped at 256
    candidates: int = 5  # top next-token candidates kept per step

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown decoding {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.strategy == "beam search" and not 2 <= self.num_beams <= 16:
            raise ValueError("Beam width must be between 2 and 16.")
        if not 0 <= self.max_new_tokens <= 512:
            raise ValueError("Max output tokens must be between 0 (automatic) and 512.")


class UnknownWordsError(ValueError):
    """Source words a word-level model cannot read; ``suggestions`` maps each to the closest words it knows (by
    spelling; empty when none is close)."""

    def __init__(self, words: list[str], suggestions: dict[str, list[str]]):
        self.words, self.suggestions = words, suggestions
        shown = "; ".join(f"“{w}” ({_nearest(suggestions.get(w, []))})" for w in words[:6])
        more = f"; and {len(words) - 6} more" if len(words) > 6 else ""
        super().__init__(f"This model does not know {shown}{more}. It only knows the words of the grammar it was "
                         "trained on (listed below: click one to add it); replace the word, or pick another model.")


def _nearest(words: list[str]) -> str:
    return f"nearest it knows: {', '.join(words)}" if words else "no word it knows is spelled alike"


@dataclass(frozen=True)
class TranslationOutput:
    """What was translated and how tokens group into words (``TranslationResult.output``)."""

    source_text: str  # the sentence as the model read it (a word-level mini's fitted to its vocabulary)
    translation: str
    source_tokens: list[str]  # display labels of the source pieces (keys of cross-attention)
    output_tokens: list[str]  # display labels of the produced pieces, ending with </s> if produced
    decoder_input_tokens: list[str]  # queries/keys of decoder self-attention: START_LABEL, then output[:-1]
    source_ids: list[int]
    output_ids: list[int]  # the produced token ids (decoder input = decoder start id, then output_ids[:-1])
    source_groups: list[list[int]]  # piece indices of each source word
    output_groups: list[list[int]]
    source_words: list[str]
    output_words: list[str]
    strategy: str
    num_beams: int
    architecture: str  # "transformer", "transformer-ssru" (Bergamot), "gru-attention", "gru-fixed"
    special_source: list[bool] = field(default_factory=list)  # per source word: a special token (</s>)
    special_output: list[bool] = field(default_factory=list)
    reference: str | None = None  # the grammar's French when the source is one of the page's samples
    gold_links: frozenset[tuple[int, int]] | None = None  # its (source word, output word) links, when the output
    # is that reference word for word (``grammar_reference``)
    languages: tuple[str, str] = ("English", "French")  # (source, output): what the figures' axes say
    decoder_start_id: int | None = None  # the id the decoder started from (its first input, START_LABEL)


# --- loading the project's GRU translators ---------------------------------------------------------------------

def load_gru(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
             progress: Progress = lambda step, fraction: None) -> LoadedModel:
    """A ``GRUTranslator`` from ``sample_data/<spec.id>`` (config.json, model.safetensors, tokenizer files)."""
    from safetensors.torch import load_file
    from transformers import PreTrainedTokenizerFast

    from models.minis.translation.rnn import GRUConfig, GRUTranslator

    folder = SAMPLE_DATA / spec.id
    if not (folder / "model.safetensors").is_file():
        raise ValueError(f"The weights of {spec.key} are missing ({folder}/model.safetensors). Train them with "
                         "`python -m models.minis.translation.train`.")
    progress("Reading the configuration", 0.2)
    config = GRUConfig.from_dict(json.loads((folder / "config.json").read_text()))
    model = GRUTranslator(config)
    progress("Loading weights", 0.5)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    # the fast tokenizer class directly: AutoTokenizer would look up "gru_translator" among transformers' models
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    model = loading.finish(model, device, dtype, progress)
    for module in model.modules():  # moving a GRU leaves its weights in separate blocks: cuDNN warns and copies
        if isinstance(module, torch.nn.RNNBase):  # them on every call; one contiguous block again
            module.flatten_parameters()
    progress("Ready", 1.0)
    return LoadedModel(spec, model, tokenizer, device, dtype, None,
                       capture=GRU_CAPTURE if config.attention else NO_ATTENTION)


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = lambda step, fraction: None) -> LoadedModel:
    """Any translation model: the project's GRUs here, everything else through ``models.core.loading`` (with capture)."""
    import transformers

    if spec.family != "translation":
        raise ValueError(f"{spec.key} is a {spec.family} model, not a translation model")
    if spec.library == "project":
        return load_gru(spec, device, dtype, progress)

    def encoder_decoder_only(config) -> None:
        if not getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"'{spec.id}' is not an encoder–decoder model, so it has no cross-attention. Pick a "
                             "translation model such as Helsinki-NLP/opus-mt-en-fr, a T5 or a BART "
                             "model. One that reads audio beside its text (Qwen2-Audio, Voxtral) "
                             "shows its text decoder on the GPT page.")
        if getattr(config, "decoder_start_token_id", None) is None and getattr(config, "bos_token_id", None) is None:
            raise ValueError(f"'{spec.id}' names no token its decoder starts from (decoder_start_token_id or "
                             "bos_token_id in config.json), so it cannot translate. T5-style models start from "
                             "their padding token: add \"decoder_start_token_id\": 0 to its config.json.")

    return loading.load_transformers(spec, transformers.AutoModelForSeq2SeqLM, device, dtype, progress,
                                     check_config=encoder_decoder_only)


def architecture(loaded: LoadedModel) -> str:
    from models.minis.translation.rnn import GRUTranslator

    if isinstance(loaded.model, GRUTranslator):
        return "gru-attention" if loaded.model.config.attention else "gru-fixed"
    return getattr(loaded.model, "architecture", "transformer")  # Bergamot's: "transformer-ssru"


# --- input checks ----------------------------------------------------------------------------------------------

def source_vocabulary(loaded: LoadedModel) -> list[str] | None:
    """The English words a word-level model knows (for suggestions and the vocabulary list); None for subword models
    (they can spell any word)."""
    if loaded.spec.source != "mini":
        return None
    from models.minis.translation import grammar

    return [w for w in grammar.english_words() if w.isalnum()]


def vocabulary_by_kind(loaded: LoadedModel) -> dict[str, list[str]] | None:
    """The English words a word-level model knows, grouped as the grammar uses them (nouns, adjectives, verbs, ...);
    None for subword models."""
    if loaded.spec.source != "mini":
        return None
    from models.minis.translation import grammar

    return grammar.english_words_by_kind()


def suggestions(known: list[str], word: str, count: int = 4) -> list[str]:
    """The known words spelled most like ``word`` (case ignored), closest first; empty when none is close."""
    by_lower = {w.lower(): w for w in known}
    return [by_lower[w] for w in difflib.get_close_matches(word.lower(), list(by_lower), n=count, cutoff=0.6)]


def _fit_to_mini(loaded: LoadedModel, sentence: str) -> tuple[str, list[str]]:
    """A word-level mini reads only its vocabulary's words: the sentence as it can read it (lower case matched to
    its spelling, punctuation split from words, marks it never saw left out) and a notice for each change; a word it
    cannot read at all raises UnknownWordsError naming it with the nearest words it knows."""
    from models.minis.translation.tokenizer import fit_to_vocabulary

    known = source_vocabulary(loaded) or []
    # the grammar writes a word one way mid-sentence ("the", "European", "August") and capitalises the first word
    fitted = fit_to_vocabulary(sentence, loaded.tokenizer.get_vocab(), known, capitalise_first=True)
    if fitted.unknown:
        raise UnknownWordsError(list(fitted.unknown), {w: suggestions(known, w) for w in fitted.unknown})
    notices = []
    if fitted.respelled:
        notices.append("Read as this model's vocabulary spells them: "
                       + ", ".join(f"“{typed}” as “{known}”" for typed, known in fitted.respelled) + ".")
    if fitted.dropped:
        notices.append("Left out " + ", ".join(f"“{mark}”" for mark in fitted.dropped)
                       + ": this model never saw that punctuation.")
    if not fitted.text:
        raise ValueError("Nothing is left to translate once the punctuation this model never saw is left out: type "
                         "an English sentence.")
    return fitted.text, notices


def _unknown_pieces(loaded: LoadedModel, sentence: str, ids: list[int]) -> list[str]:
    """A subword model still translates around a piece its tokenizer cannot read: a notice naming the words."""
    tokenizer = loaded.tokenizer
    unk = tokenizer.unk_token_id
    if unk is None or unk not in ids:
        return []
    try:
        encoding = tokenizer(sentence, return_offsets_mapping=True)
        spans = [(a, b) for i, (a, b) in zip(encoding["input_ids"], encoding["offset_mapping"]) if i == unk]
        words = [(m.start(), m.end(), m.group()) for m in re.finditer(r"\S+", sentence)]
        hit = list(dict.fromkeys(word for start, end, word in words
                                 if any(a < end and b > start for a, b in spans))) or [tokenizer.unk_token]
    except (NotImplementedError, TypeError, ValueError, KeyError):  # slow tokenizers have no offsets
        hit = [tokenizer.unk_token]
    return [f"{ids.count(unk)} piece(s) are unknown to this model's tokenizer and read as {tokenizer.unk_token}: "
            f"{', '.join(hit[:5])}"]


def encode_source(loaded: LoadedModel, sentence: str, max_source_tokens: int) -> tuple[str, list[int], list[str]]:
    """(the sentence as the model reads it, its token ids with the model's special tokens, notices); user mistakes
    raise ValueError. A word-level mini reads the sentence fitted to its vocabulary (``_fit_to_mini``); a hub model
    reads it through its own tokenizer, unchanged."""
    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError("Type or pick an English sentence to translate.")
    if len(sentence) > text.MAX_CHARACTERS:
        raise ValueError(f"The text has {len(sentence):,} characters; translate one sentence at a time.")
    notices: list[str] = []
    if source_vocabulary(loaded) is not None:
        sentence, notices = _fit_to_mini(loaded, sentence)
    ids = loaded.tokenizer(sentence)["input_ids"]
    if loaded.max_positions and len(ids) > loaded.max_positions:
        raise ValueError(f"The sentence has {len(ids)} tokens; this model reads at most {loaded.max_positions}. "
                         "Shorten it.")
    if len(ids) > max_source_tokens:
        raise ValueError(f"The sentence has {len(ids)} tokens; the limit is {max_source_tokens}. Shorten it, or "
                         "raise the source token limit.")
    return sentence, ids, notices + _unknown_pieces(loaded, sentence, ids)


# --- decoding --------------------------------------------------------------------------------------------------

def _max_new(settings: TranslationSettings, source_length: int, max_positions: int | None) -> int:
    """Output tokens to allow: as set, or twice the source + 10; never past the decoder's position table."""
    wanted = settings.max_new_tokens or min(256, 2 * source_length + 10)
    return min(wanted, max_positions - 1) if max_positions else wanted


@torch.no_grad()
def _gru_search(model, input_ids: torch.Tensor, beams: int, max_new: int) -> list[int]:
    """Beam search over the GRU (``decoding.beam_search``, transformers' rule; beams = 1 is greedy).
    Returns decoder ids: start, output tokens, </s> if reached."""
    config = model.config
    mask = torch.ones_like(input_ids)
    annotations, projected, summary, state, source_mask = model.start_state(input_ids, mask)

    def step(previous: torch.Tensor, states: torch.Tensor):
        n = len(previous)
        log_probs, after, _ = model.step(previous, states, annotations.expand(n, -1, -1),
                                         None if projected is None else projected.expand(n, -1, -1),
                                         summary.expand(n, -1), source_mask.expand(n, -1))
        return log_probs.float(), after

    start = config.decoder_start_token_id
    found = decoding.beam_search(step, state, start=start, end=config.eos_token_id, beams=beams,
                                 max_new=max_new, device=input_ids.device)
    return [start, *found]


def _transformer_search(loaded: LoadedModel, input_ids: torch.Tensor, settings: TranslationSettings,
                        max_new: int) -> list[int]:
    kwargs = dict(max_new_tokens=max_new, attention_mask=torch.ones_like(input_ids), do_sample=False,
                  num_return_sequences=1)
    if settings.strategy == "beam search":
        kwargs.update(num_beams=settings.num_beams, early_stopping=True)
    else:
        kwargs.update(num_beams=1)
    output = loaded.model.generate(input_ids, **kwargs)[0].tolist()
    pad = loaded.tokenizer.pad_token_id
    start = output[0]  # what generate started the decoder from (the config's decoder start, or its bos)
    while len(output) > 2 and output[-1] == pad and pad != start:  # beam outputs may be padded
        output.pop()
    return output


# --- the run ---------------------------------------------------------------------------------------------------

_display = text.display_ids  # special tokens by name, others as display_token
_top = text.top_tokens


def _words(tokenizer, ids: list[int]):
    specials = set(tokenizer.all_special_tokens)
    # an id past the tokenizer's vocabulary (a model whose target vocabulary is its own, as FSMT's) has no piece
    pieces = [piece if piece is not None else f"⟨id {i}⟩"
              for i, piece in zip(ids, tokenizer.convert_ids_to_tokens(ids))]
    groups = alignment.word_groups(pieces, specials)
    words = [text.visible_text(w) for w in alignment.word_labels(pieces, groups)]
    return groups, words, [pieces[g[0]] in specials for g in groups]


@dataclass(frozen=True, kw_only=True)
class TranslationResult(RunResult):
    """A translation: ``tokens`` are the source pieces; ``attention`` has ``cross`` (output × source) when the model
    attends, and ``encoder`` / ``decoder`` self-attention for Transformers."""

    output: TranslationOutput
    generation: tuple[GenerationStep, ...]  # one step per produced token, with the candidates it was chosen from
    opening_head: tuple[int, int | None] = (0, None)  # (layer, head or None = averaged) cross-attention opens on


def run(loaded: LoadedModel, inputs: TextInput, options: TranslationSettings | None = None) -> TranslationResult:
    """Translate the sentence and capture the attention of the chosen output (see the module docstring); a source
    longer than ``inputs.max_tokens`` tokens is refused with a message, never cut."""
    settings = options or TranslationSettings()
    settings.validate()
    if not 4 <= inputs.max_tokens <= 1024:
        raise ValueError("The source token limit must be between 4 and 1024.")
    sentence, source_ids, notices = encode_source(loaded, inputs.text, inputs.max_tokens)
    kind = architecture(loaded)
    tokenizer = loaded.tokenizer
    input_ids = torch.tensor([source_ids], device=loaded.device)
    max_new = _max_new(settings, len(source_ids), loaded.max_positions)
    beams = settings.num_beams if settings.strategy == "beam search" else 1

    with text_out_of_memory(loaded.device, len(source_ids) + max_new), torch.inference_mode():
        if kind == "transformer":
            decoded = _transformer_search(loaded, input_ids, settings, max_new)
        else:
            decoded = _gru_search(loaded.model, input_ids, beams, max_new)
        decoder_input = torch.tensor([decoded[:-1]], device=loaded.device)  # row t produces decoded[t + 1]
        produced = decoded[1:]
        source_tokens = _display(tokenizer, source_ids)
        output_tokens = _display(tokenizer, produced)
        decoder_tokens = [START_LABEL] + output_tokens[:-1]
        attention: dict[str, AttentionMaps] = {}
        if kind == "transformer":
            with capture.recording(loaded.model) as recorder:
                logits = loaded.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                      decoder_input_ids=decoder_input, use_cache=False).logits[0]
            attention["encoder"] = recorder.attention_maps("encoder", 0, query_tokens=source_tokens,
                                                           key_tokens=source_tokens)
            attention["decoder"] = recorder.attention_maps("decoder", 0, query_tokens=decoder_tokens,
                                                           key_tokens=decoder_tokens)
            attention["cross"] = recorder.attention_maps("cross", 0, query_tokens=output_tokens,
                                                         key_tokens=source_tokens)
        else:
            logits, weights = loaded.model(input_ids, torch.ones_like(input_ids), decoder_input)
            logits = logits[0]
            if weights is not None:
                attention["cross"] = StoredAttention("cross", output_tokens, source_tokens,
                                                     [weights[0].float().cpu().numpy()[None]])
    probabilities = torch.softmax(logits.float(), dim=-1).cpu()  # (steps, vocab)
    steps = tuple(GenerationStep(t, output_tokens[t], float(probabilities[t, token]),
                                 _top(probabilities[t], tokenizer, settings.candidates), query=t)
                  for t, token in enumerate(produced))

    source_groups, source_words, special_source = _words(tokenizer, source_ids)
    output_groups, output_words, special_output = _words(tokenizer, produced)
    translation = tokenizer.decode(produced, skip_special_tokens=True)
    if produced and produced[-1] != tokenizer.eos_token_id:
        notices.append(f"The translation stopped at {max_new} tokens before the model ended it.")
    output = TranslationOutput(sentence, translation, source_tokens, output_tokens, decoder_tokens, source_ids,
                               produced, source_groups, output_groups, source_words, output_words, settings.strategy,
                               beams, kind, special_source, special_output)
    reference, gold = grammar_reference(output)
    output = replace(output, reference=reference, gold_links=gold, decoder_start_id=int(decoded[0]))
    return TranslationResult(model=loaded.info(), tokens=source_tokens, attention=attention, input_name=inputs.name,
                             output=output, generation=steps, opening_head=_opening_head(loaded, attention),
                             notices=tuple(notices))


# --- what the page opens on, and the grammar's gold ----------------------------------------------------------------

def read_metrics() -> dict | None:
    """The minis' measured quality (``sample_data/translation/metrics.json``, written by the trainer), or None
    before they are trained."""
    return json.loads(METRICS.read_text()) if METRICS.is_file() else None


def measured_quality(loaded: LoadedModel | None = None, result: RunResult | None = None, options=None) -> dict:
    """The metrics file as an analysis (the quality figures read it, whatever model is loaded); a message when the
    minis have not been trained yet."""
    metrics = read_metrics()
    if not metrics:
        raise ValueError("No measurements yet: train the minis with `python -m models.minis.translation.train`.")
    return metrics


def _opening_head(loaded: LoadedModel, attention: dict[str, AttentionMaps]) -> tuple[int, int | None]:
    """(layer, head or None = heads averaged) the cross-attention figures open on: the mini Transformer's
    best-aligned head from its card, else the last layer's head average."""
    if loaded.spec.source == "mini" and architecture(loaded) == "transformer":
        best = ((read_metrics() or {}).get("models", {}).get("transformer", {}).get("alignment") or {}).get(
            "best_head")
        if best:
            return best["layer"], best["head"]
    return (attention["cross"].num_layers - 1 if "cross" in attention else 0), None


@functools.cache
def showcase() -> dict:
    """The page's sample sentences with their gold links, by name: a constant (the grammar's samples are fixed by a
    seed), made once."""
    from models.minis.translation import grammar

    return grammar.showcase_pairs()


def grammar_reference(output: TranslationOutput) -> tuple[str | None, frozenset[tuple[int, int]] | None]:
    """The grammar's French for this source when it is one of the page's samples (else None), and its gold links
    ``{(source word, output word)}`` in the word positions of ``output`` (which include special tokens) when the
    model's translation is the reference word for word (else None)."""
    pair = next((p for p in showcase().values() if p.english == output.source_text.strip()), None)
    if pair is None:
        return None, None
    src_real = [i for i, special in enumerate(output.special_source) if not special]
    out_real = [j for j, special in enumerate(output.special_output) if not special]
    if ([output.source_words[i] for i in src_real] != pair.en_words
            or [output.output_words[j] for j in out_real] != pair.fr_words):
        return pair.french, None  # the model's translation differs from the reference: no gold for it
    return pair.french, frozenset((src_real[a], out_real[b]) for a, b in pair.alignment)


# --- cross-attention as an alignment ---------------------------------------------------------------------------

def cross_weights(maps: AttentionMaps, layer: int | None, head: int | None) -> np.ndarray:
    """One ``(queries, keys)`` map: a layer's head, its head average (head None), or the average over all layers
    (layer None)."""
    if layer is not None:
        return maps.head(layer, head)
    return np.mean([maps.head(i, head) for i in range(maps.num_layers)], axis=0)


def describe_view(maps: AttentionMaps, layer: int | None, head: int | None) -> str:
    """Which attention a figure shows, in words."""
    if maps.num_layers == 1 and maps.num_heads == 1:
        return "additive attention a_t"
    where = "all layers" if layer is None else f"layer {layer}"
    return f"{where}, {'heads averaged' if head is None else f'head {head}'}"


@dataclass(frozen=True)
class AlignmentView:
    """One alignment figure's data: ``weights (rows, columns)`` with labels, and links as (column, row) pairs."""

    weights: np.ndarray
    row_labels: list[str]  # output words or tokens
    column_labels: list[str]  # source words or tokens
    title: str
    gold: frozenset[tuple[int, int]] | None = None  # the grammar's links, when the sentence is one of its samples
    argmax: set[tuple[int, int]] | None = None  # each output word's most-attended source word
    aer: float | None = None  # of ``argmax`` against ``gold``


def alignment_view(result: TranslationResult, layer: int | None, head: int | None, words: bool) -> AlignmentView:
    """Cross-attention of ``result`` as a figure: pieces as computed, or words (sum over source pieces, mean over
    output pieces) with argmax links, gold links and AER where the grammar knows the sentence."""
    out = result.output
    maps = result.maps("cross")
    weights = cross_weights(maps, layer, head)
    title = f"{result.model.key}: {describe_view(maps, layer, head)}"
    if not words:
        return AlignmentView(weights, out.output_tokens, out.source_tokens, title)
    word_weights = word_attention(weights, out)
    links = hard_links(word_weights, out)
    aer = None if out.gold_links is None else alignment.alignment_error_rate(links, out.gold_links)
    return AlignmentView(word_weights, out.output_words, out.source_words, title, out.gold_links, links, aer)


def word_attention(weights: np.ndarray, output: TranslationOutput) -> np.ndarray:
    """Piece cross-attention ``(output pieces, source pieces)`` -> ``(output words, source words)``: summed over a
    source word's pieces, averaged over an output word's pieces. Rows still sum to 1."""
    return alignment.merge_to_words(weights, output.output_groups, output.source_groups)


def hard_links(word_weights: np.ndarray, output: TranslationOutput) -> set[tuple[int, int]]:
    """Each real output word linked to its most-attended real source word: {(source word, output word)}."""
    sources = [i for i, special in enumerate(output.special_source) if not special]
    targets = [j for j, special in enumerate(output.special_output) if not special]
    return alignment.hard_alignment(word_weights, sources, targets)
