"""The math of the explanation methods on recorded tensors (pure; the methods that call it are the
classes of models/analysis/methods.py).

- Value norms (Kobayashi et al. 2020, "Attention is Not Only a Weight", eq. 5):
  ``‖Σ_h α^h_ij f^h(x_j)‖``.
- ALTI (Ferrando et al. 2022, "Measuring the Mixing of Contextual Information in the Transformer",
  eq. 6–8): ``T_i(x_j) = Σ_h α^h_ij f^h(x_j) + δ_ij x_j``; ``max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``
  per row, normalised.
- Gradient rollout (Chefer et al. 2021b, "Generic Attention-model Explainability", eq. 5–6 and, for
  an encoder–decoder, eq. 6–11): ``Ā = E_h[(∇A ⊙ A)⁺]``, ``R ← R + Ā · R``.
- Grad-CAM (Selvaraju et al. 2017): on the last layer's heads as channels (Chefer et al. 2021a's
  baseline for ViT), or on tokens reshaped to their grid."""
from __future__ import annotations

import torch


def value_norm_matrix(attention: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``‖Σ_h α^h_ij f^h(x_j)‖₂`` for every (i, j): attention (…, H, N, N), values (…, H, N, D) ->
    (…, N, N) (leading dimensions: windows)."""
    # summed over heads first
    return torch.einsum("...hij,...hjd->...ijd", attention, values).norm(dim=-1)


def value_norm_row(attention: torch.Tensor, values: torch.Tensor, query: int) -> torch.Tensor:
    """Row ``query`` of ``value_norm_matrix`` without the (N, N, D) tensor: (N,)."""
    return torch.einsum("hj,hjd->jd", attention[:, query], values).norm(dim=-1)


def alti_matrix(attention: torch.Tensor, values: torch.Tensor, residual: torch.Tensor
                ) -> torch.Tensor:
    """One layer's ALTI contributions (N, N), rows summing to 1: attention (H, N, N), values
    (H, N, D), residual (N, D) the block's input. The output projection's bias belongs to no token
    and is left out (pre-LN blocks: no norm after the sum)."""
    # (N, N, D): T_i(x_j) without the residual
    transformed = torch.einsum("hij,hjd->ijd", attention, values)
    n = residual.shape[0]
    index = torch.arange(n, device=residual.device)
    transformed[index, index] += residual  # δ_ij x_j
    output = transformed.sum(1, keepdim=True)  # (N, 1, D): y_i
    # (N, N)
    contributions = (output.abs().sum(-1) - (output - transformed).abs().sum(-1)).clamp(min=0)
    return contributions / contributions.sum(-1, keepdim=True).clamp(min=1e-12)


def gradient_rollout(attentions: list[torch.Tensor], gradients: list[torch.Tensor] | None = None
                     ) -> torch.Tensor:
    """Chefer et al. 2021b: ``R = I``; per layer ``Ā = E_h[(∇A ⊙ A)⁺]``, ``R ← R + Ā·R``. Each
    attention (H, N, N); ``gradients`` None stands for all ones (then R = 2^L × plain rollout, the
    test's check)."""
    n = attentions[0].shape[-1]
    result = torch.eye(n, dtype=torch.float32, device=attentions[0].device)
    for index, attention in enumerate(attentions):
        gradient = None if gradients is None else gradients[index]
        fused = gradient_fusion(attention, gradient)  # (N, N)
        result = result + fused @ result
    return result


def gradient_fusion(attention: torch.Tensor, gradient: torch.Tensor | None) -> torch.Tensor:
    """``Ā = E_h[(∇A ⊙ A)⁺]``: attention, gradient (…, H, N, N) -> (…, N, N); ``gradient`` None
    stands for ones."""
    weighted = attention.float() if gradient is None else gradient.float() * attention.float()
    return weighted.clamp(min=0).mean(-3)


def _residual_normalised(relevance: torch.Tensor) -> torch.Tensor:
    """Chefer et al. 2021b eq. 9–10: ``R̄ = R̂ + I`` with ``R̂ = R − I`` divided by its row sums
    (rows of zeros stay zero)."""
    eye = torch.eye(relevance.shape[0], dtype=relevance.dtype, device=relevance.device)
    hat = relevance - eye
    sums = hat.sum(-1, keepdim=True)
    return hat / sums.where(sums.abs() > 1e-12, torch.ones(())) + eye


def encoder_decoder_rollout(encoder: list[torch.Tensor], decoder: list[torch.Tensor],
                            cross: list[torch.Tensor],
                            gradients: dict[str, list[torch.Tensor]] | None = None) -> torch.Tensor:
    """Chefer et al. 2021b's rules for an encoder–decoder: the relevance ``R^{qs}`` (T, S) of each
    decoder position (query) for each source token. Encoder self-attention (S, S) each:
    ``R^{ss} ← R^{ss} + Ā R^{ss}`` from I (eq. 6); per decoder layer, self-attention (T, T):
    ``R^{qq} ← R^{qq} + Ā R^{qq}``, ``R^{qs} ← R^{qs} + Ā R^{qs}`` (eq. 7–8), then cross-attention
    (T, S): ``R^{qs} ← R^{qs} + (R̄^{qq})ᵀ Ā R̄^{ss}`` (eq. 11; ``R^{qq}`` is unchanged since the
    source never attends to the output). ``Ā = E_h[(∇A ⊙ A)⁺]``; ``gradients`` None stands for all
    ones (then it is rollout's propagation rule, the "rollout" of an encoder–decoder). ``decoder``
    empty: a decoder without self-attention (Bergamot's SSRU), whose ``R^{qq}`` stays I: no
    attention mixes its positions."""
    def fused(attention: torch.Tensor, kind: str, index: int) -> torch.Tensor:
        return gradient_fusion(attention, None if gradients is None else gradients[kind][index])

    sources, outputs = cross[0].shape[-1], cross[0].shape[-2]
    r_ss = torch.eye(sources)
    for index, attention in enumerate(encoder):
        r_ss = r_ss + fused(attention, "encoder", index) @ r_ss
    r_qq, r_qs = torch.eye(outputs), torch.zeros(outputs, sources)
    normalised_ss = _residual_normalised(r_ss)
    for index, cross_attention in enumerate(cross):
        if decoder:
            a_qq = fused(decoder[index], "decoder", index)
            r_qq, r_qs = r_qq + a_qq @ r_qq, r_qs + a_qq @ r_qs
        weighted = fused(cross_attention, "cross", index)
        r_qs = r_qs + _residual_normalised(r_qq).T @ weighted @ normalised_ss
    return r_qs


def grad_cam(attention: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """attention, gradient (H, N, N) of the last layer -> (N, N) ``ReLU(Σ_h w_h A^h)`` with ``w_h``
    the mean gradient of head h (Chefer et al. 2021a's Grad-CAM baseline for ViT; the sum is their
    mean over heads × H)."""
    weights = gradient.mean(dim=(1, 2), keepdim=True)  # (H, 1, 1)
    return (weights * attention).mean(0).clamp(min=0)


def grad_cam_tokens(features: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """Classic Grad-CAM (Selvaraju et al. 2017) on tokens reshaped to their grid: features, gradient
    (N, C) of one layer's output -> (N,) ``ReLU(Σ_c w_c F_c)`` with ``w_c`` the gradient of channel
    c averaged over the grid."""
    return (features.float() @ gradient.float().mean(0)).clamp(min=0)


def product(matrices: list[torch.Tensor]) -> torch.Tensor:
    """``M_L ⋯ M_2 M_1`` of per-layer matrices, first layer first in the list."""
    result = matrices[0]
    for matrix in matrices[1:]:
        result = matrix @ result
    return result
