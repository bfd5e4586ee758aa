"""An induction circuit built by hand, and the score decomposition finding it again (Elhage et al. 2021, "A
Mathematical Framework for Transformer Circuits"; Olsson et al. 2022, "In-context Learning and Induction Heads").

A two-layer, attention-only GPT-2 (its MLPs are zero) over twelve letters, whose residual stream has three blocks of
coordinates: the current token (``TOK``, one per letter), the position (``POS``), and a block for the previous token
(``PREV``), empty in the embeddings. Every vector is centred within its block, so LayerNorm only rescales it.

- Layer 0, head 0, a previous-token head: its query reads the position ``p`` and asks for ``p − 1``; its key reads
  the position; its value reads the token, and its output writes that token into ``PREV``. After it, position ``p``
  holds "the token before me".
- Layer 1, head 0, an induction head: its query reads the current token ``t``; its key reads ``PREV``. A key scores
  high where the token before it was ``t``: the token after the earlier occurrence of the current one.
- The other head of each layer has small random weights: a distractor that writes noise into the stream.

On a block of letters repeated twice, the decomposition (``models.analysis.why``) of the induction head's cells
names the circuit back: the key side is carried by layer 0 head 0 (K-composition), the query side by the token
embedding. The same analysis on the offline SmolLM2 finds its previous-token heads behind its induction heads.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.analysis import roles, why

LETTERS = tuple("ABCDEFGHIJKL")  # the toy's vocabulary
POSITIONS = 24  # the longest sequence: two copies of a block of at most 12 letters
HEADS = 2  # per layer: the designed head (0) and a distractor (1)
STRENGTH = 4.0  # how sharply the designed heads attend (their query weights)
DISTRACTOR = 0.3  # the distractors' random weights' scale

# what the same analysis finds on SmolLM2-135M (tests/test_why.py re-measures it): over the second copy of [BOS] +
# R + R (32 random tokens twice), what lifts each induction head's key above the row's runner-up through the key side
SMOLLM2_FINDING = (
    "On the offline SmolLM2-135M, on 32 random tokens repeated (the roles' sequence), the same split of its induction "
    "heads' cells (query in the second copy, key the token after the earlier occurrence, against each row's next "
    "strongest key) finds the circuit: layer 16 head 0, its strongest previous-token head (0.89), carries 95–144% of "
    "the margin through the keys of induction heads 18/6, 17/4, 17/3, 17/5 and 18/7 (with layer 17 head 8, another "
    "previous-token head, adding 20–27% to 18/6 and 18/7); on the query side MLP 0 carries about 40% (the current "
    "token, as an extended embedding). Head 23/2's keys are fed by later previous-token heads (22/1, 19/3, 16/0) and "
    "its queries by the induction heads 18/6 and 18/7 (Q-composition).")


@dataclass(frozen=True)
class Circuit:
    """The toy model's run on ``tokens`` and the decomposition of its induction head."""

    tokens: tuple[str, ...]
    previous_map: np.ndarray  # (T, T) layer 0 head 0's attention
    induction_map: np.ndarray  # (T, T) layer 1 head 0's attention
    role_scores: dict[str, np.ndarray]  # models.analysis.roles scores of the toy's heads, (2, 2) each
    head: "why.HeadWhy"  # the induction head over its second-copy cells
    cell: "why.CellWhy"  # the induction head's cell at the last position
    block: int  # letters in the repeated block


def sequence(block: int, seed: int) -> list[int]:
    """``block`` distinct letters (a seeded draw), twice."""
    if not 2 <= block <= len(LETTERS):
        raise ValueError(f"the repeated block has 2 to {len(LETTERS)} letters, not {block}")
    letters = np.random.default_rng(seed).permutation(len(LETTERS))[:block].tolist()
    return letters + letters


def centred(size: int) -> torch.Tensor:
    """``(size, size)``: row ``i`` is the one-hot ``e_i`` minus the block's mean, so it sums to 0."""
    return torch.eye(size, dtype=torch.float64) - 1.0 / size


def build(seed: int = 0, strength: float = STRENGTH):
    """The hand-built two-layer attention-only GPT-2 (transformers, capture attention), float64."""
    import transformers

    from models.core import capture

    capture.register()
    vocab, positions = len(LETTERS), POSITIONS
    width = 2 * vocab + positions  # TOK | POS | PREV
    tok, pos = slice(0, vocab), slice(vocab, vocab + positions)  # PREV: the rest, written by layer 0 head 0
    config = transformers.GPT2Config(vocab_size=vocab, n_embd=width, n_layer=2, n_head=HEADS, n_positions=positions,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="capture",
                                                      dtype=torch.float64).eval()
    size = width // HEADS  # 24 per head: a position per dimension
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        base = model.transformer
        base.wte.weight[:, tok] = centred(vocab)
        base.wpe.weight[:, pos] = centred(positions)
        for block in base.h:
            block.ln_1.weight.fill_(1.0)
            block.ln_2.weight.fill_(1.0)
        base.ln_f.weight.fill_(1.0)
        # Conv1D keeps (in, out): c_attn's columns are q | k | v, each heads × size wide; c_proj's rows the heads
        first, second = base.h[0].attn, base.h[1].attn
        query, key, value = (first.c_attn.weight[:, i * width:(i + 1) * width] for i in range(3))
        for p in range(1, positions):
            query[vocab + p, p - 1] = strength  # position p asks for position p − 1 …
        for p in range(positions):
            key[vocab + p, p] = 1.0  # … which each key announces
        for t in range(vocab):
            value[t, t] = 1.0  # the key's token …
            first.c_proj.weight[t, vocab + positions + t] = 0.2  # … written into PREV (LayerNorm scaled it up ~5×)
        query, key = (second.c_attn.weight[:, i * width:(i + 1) * width] for i in range(2))
        for t in range(vocab):
            query[t, t] = strength  # the current token …
            key[vocab + positions + t, t] = 1.0  # … against the token before each key
        for attention in (first, second):  # head 1: a distractor with small random weights
            for part in range(3):
                columns = slice(part * width + size, (part + 1) * width)
                attention.c_attn.weight[:, columns] = torch.randn(width, size, generator=generator,
                                                                  dtype=torch.float64) * DISTRACTOR
            attention.c_proj.weight[size:, :] = torch.randn(size, width, generator=generator,
                                                           dtype=torch.float64) * DISTRACTOR / 30
    return model


def circuit(loaded=None, result=None, options=None) -> Circuit:
    """The lesson's analysis: build the toy, run it on ``options.block`` letters (seed ``options.seed``) twice, and
    split its induction head's cells. ``loaded`` and ``result`` are unused: the lesson brings its own model."""
    from models.core import capture

    block = int(getattr(options, "block", 8))
    seed = int(getattr(options, "seed", 0))
    model = build(seed)
    ids = torch.tensor([sequence(block, seed)])
    tokens = tuple(LETTERS[i] for i in ids[0].tolist())
    count = len(tokens)
    with torch.inference_mode(), capture.recording(model) as recorder:
        model(input_ids=ids, use_cache=False)
    maps = recorder.attention_maps("self", 0, query_tokens=list(tokens), key_tokens=list(tokens))
    # the roles the app measures, on the toy's own repeated random letters ([BOS] + R + R with R the whole block)
    first = torch.tensor([[ids[0, 0].item()] + sequence(block, seed + 1)])
    with torch.inference_mode(), capture.recording(model) as probe:
        model(input_ids=first, use_cache=False)
    probed = probe.attention_maps("self", 0)
    scores = {name: np.zeros((2, HEADS), dtype=np.float32) for name in roles.ROLES}
    for layer in range(2):
        for name, values in roles.role_scores(probed.layer(layer)[None], block).items():
            scores[name][layer] = values
    named = why.role_names(scores)

    def forward():
        return model(input_ids=ids, use_cache=False)

    cap = why.capture_forward(model, forward, 1, list(range(count)), 0, list(tokens))
    cells = [(i, i - block + 1) for i in range(block, count)]  # the token after the earlier occurrence
    arch = why.architecture(model)
    runners = []
    for i, j in cells:
        _, allowed, _, weights, _ = why._row(cap, arch.blocks[1], 0, i, arch.group)
        runners.append(why._runner_up(weights, allowed, j))
    head = why.head_table(model, cap, 1, 0, cells, runners, named, model_name="toy induction circuit",
                          input_name=" ".join(tokens),
                          selection=f"the second copy's rows {block}–{count - 1}, each with the letter after the "
                                    "earlier occurrence of its own")
    last = cells[-1]
    cell = why.cell(model, cap, 1, 0, last[0], last[1], list(tokens), named, check=True,
                    model_name="toy induction circuit", input_name=" ".join(tokens))
    return Circuit(tokens, maps.layer(0)[0].copy(), maps.layer(1)[0].copy(), scores, head, cell, block)
