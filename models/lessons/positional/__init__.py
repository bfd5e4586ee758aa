"""Positional encodings: the formulas, the encodings inside loaded models, and why attention needs them.

Self-attention is permutation-equivariant — shuffle its input tokens and its outputs shuffle the same way — so a
transformer only knows word order through what its position scheme adds.

- ``formulas``: sinusoidal 1-D (Vaswani et al. 2017) and 2-D (MAE's channel layout), position and patch similarity
  (ViT, Dosovitskiy et al. 2021, Fig. 7), grid interpolation, RoPE (Su et al. 2021), ALiBi (Press et al. 2022),
  T5 relative-position buckets (Raffel et al. 2020); pure numpy;
- ``in_models``: learned absolute tables, RoPE settings and ``inv_freq`` read out of a loaded model;
- ``equivariance``: the permutation-equivariance demo on one tiny self-attention layer.

The positional page's views that read a loaded model name one of these as their analysis ``f(loaded, result,
options)``: ``equivariance_of_model``, ``learned_table_of_model``, ``position_grid``, ``rope_of_model``.

Every public name is re-exported here: ``from models.lessons import positional as pe; pe.sinusoidal_encoding(...)``.
Nothing here imports Streamlit.
"""
from models.lessons.positional.equivariance import (
    MAX_DEMO_TOKENS,
    EquivarianceDemo,
    EquivarianceRuns,
    equivariance_comparison,
    equivariance_of_model,
    permutation_equivariance,
    tiny_self_attention,
    token_embeddings,
)
from models.lessons.positional.formulas import (
    LATEX,
    alibi_bias,
    alibi_slopes,
    interpolate_grid,
    neighbour_similarity,
    patch_similarity,
    position_similarity,
    rope_angles,
    rope_decay_bound,
    rope_frequencies,
    rope_offset_demo,
    rope_rotate,
    rope_scores,
    sinusoidal_encoding,
    sinusoidal_encoding_2d,
    sinusoidal_frequencies,
    sinusoidal_wavelengths,
    t5_bucket_matrix,
    t5_relative_position_bucket,
)
from models.lessons.positional.in_models import (
    GRID_NOTES,
    GRID_SOURCES,
    SINUSOIDAL_GRID,
    UNTRAINED_VIT,
    LayerTypeRope,
    LearnedPositions,
    ModelPositions,
    RopeInModel,
    RopeSettings,
    hub_model_cached,
    learned_positions,
    learned_table_of_model,
    model_inv_freq,
    position_grid,
    position_scheme,
    rope_by_layer_type,
    rope_in_model,
    rope_of_model,
    rope_settings,
    untrained_vit_positions,
)

__all__ = [
    # formulas
    "LATEX", "sinusoidal_frequencies", "sinusoidal_wavelengths", "sinusoidal_encoding", "sinusoidal_encoding_2d",
    "position_similarity", "patch_similarity", "interpolate_grid", "neighbour_similarity",
    "rope_frequencies", "rope_angles", "rope_rotate", "rope_scores", "rope_offset_demo", "rope_decay_bound",
    "alibi_slopes", "alibi_bias", "t5_relative_position_bucket", "t5_bucket_matrix",
    # in models
    "LearnedPositions", "learned_positions", "position_scheme", "UNTRAINED_VIT", "untrained_vit_positions",
    "hub_model_cached", "RopeSettings", "rope_settings", "RopeInModel", "rope_in_model", "model_inv_freq",
    "LayerTypeRope", "rope_by_layer_type",
    # the page's analyses of loaded models: f(loaded, result, options)
    "ModelPositions", "learned_table_of_model", "GRID_SOURCES", "SINUSOIDAL_GRID", "GRID_NOTES", "position_grid",
    "rope_of_model", "EquivarianceRuns", "equivariance_of_model",
    # equivariance
    "EquivarianceDemo", "tiny_self_attention", "MAX_DEMO_TOKENS", "token_embeddings", "equivariance_comparison",
    "permutation_equivariance",
]
