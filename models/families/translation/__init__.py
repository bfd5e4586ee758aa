"""Encoder–decoder translation: Transformers and this project's GRUs with and without attention (``model.py``);
the explanation adapter (``explain.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import TextInput
from models.core.specs import ModelSpec
from models.families.translation import explain, model

SPECS = (
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
    ModelSpec("translation", "opus-mt-en-fr", "hub", "Helsinki-NLP/opus-mt-en-fr", "CC-BY-4.0",
              "OPUS parallel corpora (Tiedemann & Thottingal 2020)", "Marian: 6+6 layers × 8 heads, SentencePiece."),
)

FAMILY = Family("translation", "encoder–decoder translation model", TextInput, model.load, model.run,
                model.TranslationResult,
                views=("alignment", "decoding_step", "accuracy_by_length", "aer_grid", "head", "head_zoom", "head_level",
                       "query_row", "grid",
                       "head_statistics", "focus", "decoder_lens", "faithfulness", "explanations", "token_attribution"),
                options=model.TranslationSettings,
                specs=SPECS,
                explainer=explain)
