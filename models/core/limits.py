"""The app's deliberate limits in one place, each overridable by an environment variable (see docs/LIMITS.md).

The app runs on shared lab servers that a room of students opens at once, so every request's memory and time are
bounded. What each limit bounds:

- tokens N: a text run keeps each layer's queries and keys, ``layers × (heads + kv_heads) × N × head_dim`` values
  (SmolLM2 at N = 8192 on the CPU, float16: 30 × (9 + 3) × 8192 × 64 × 2 B ≈ 0.38 GB; Llama-3.2-1B at N = 131,072
  on a GPU, bfloat16: 16 × (32 + 8) × 131,072 × 64 × 2 B ≈ 10.7 GB); views are reductions whose peak is one chunk of
  query rows, never ``N²``. On the CPU (and MPS) the sidebar's token limit cannot exceed ``MAX_TOKENS``; on a GPU
  it follows the device: the ceiling is ``MAX_TOKENS_GPU``, and each run is checked against the memory free on the
  device before it starts (``models.core.capture.check_fits`` says how many tokens fit, ``tokens_that_fit``);
- characters: text beyond ``max_characters(tokens)`` (``MAX_CHARACTERS``, or ``CHARACTERS_PER_TOKEN`` per token
  of a higher token limit) is not even tokenised (tokenising 10 MB of text takes seconds);
- generation: ``MAX_NEW_TOKENS`` decoding steps, each a forward over the growing sequence;
- images: ``MAX_IMAGE_PIXELS`` is checked from the file header before decoding (a 100 kB PNG can claim 144
  megapixels = 576 MB of RGBA), larger photos are downscaled to ``MAX_IMAGE_SIDE`` on decode;
- uploads: Streamlit refuses files above ``server.maxUploadSize`` MB in the browser; ``MAX_UPLOAD_BYTES`` is the same
  number (read from ``STREAMLIT_SERVER_MAX_UPLOAD_SIZE`` or the project's .streamlit/config.toml), checked again
  server-side for bytes that did not come through the uploader; ``MAX_UPLOAD_BYTES_PER_SESSION`` and
  ``MAX_UPLOADS_PER_SESSION`` bound what one session holds (Streamlit keeps each upload until the session ends).

A bad value in the environment stops the app at start with a message naming the variable, not at the first request.
"""
from __future__ import annotations

import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STREAMLIT_CONFIG = ROOT / ".streamlit" / "config.toml"
STREAMLIT_DEFAULT_UPLOAD_MB = 200  # Streamlit's own default for server.maxUploadSize


def _setting(name: str, default: int, minimum: int) -> int:
    """An integer from the environment variable ``name`` (underscores allowed: 64_000_000), else ``default``."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number; unset it or give one such as {default}.") from None
    if value < minimum:
        raise ValueError(f"{name}={value} is below the smallest useful value {minimum}.")
    return value


def _upload_megabytes() -> int:
    """server.maxUploadSize as Streamlit will see it: its environment variable, else the project's config file."""
    if os.environ.get("STREAMLIT_SERVER_MAX_UPLOAD_SIZE"):
        return _setting("STREAMLIT_SERVER_MAX_UPLOAD_SIZE", STREAMLIT_DEFAULT_UPLOAD_MB, 1)
    if STREAMLIT_CONFIG.is_file():
        server = tomllib.loads(STREAMLIT_CONFIG.read_text()).get("server", {})
        return int(server.get("maxUploadSize", STREAMLIT_DEFAULT_UPLOAD_MB))
    return STREAMLIT_DEFAULT_UPLOAD_MB


MAX_TOKENS = _setting("ATTN_EXPLORER_MAX_TOKENS", 8192, 16)  # highest token limit the sidebar offers (CPU, MPS)
# on a GPU: the highest token limit offered; what fits is decided per run by the device's free memory
MAX_TOKENS_GPU = _setting("ATTN_EXPLORER_MAX_TOKENS_GPU", 262_144, 16)
DEFAULT_TOKENS = min(512, MAX_TOKENS)  # the sidebar's token limit when a page opens
MAX_CHARACTERS = _setting("ATTN_EXPLORER_MAX_CHARACTERS", 200_000, 1_000)  # text beyond this is not tokenised
CHARACTERS_PER_TOKEN = 12  # a higher token limit reads this many characters per token (English BPE: ~4–5)
MAX_NEW_TOKENS = _setting("ATTN_EXPLORER_MAX_NEW_TOKENS", 256, 1)  # generation length
MAX_IMAGE_PIXELS = _setting("ATTN_EXPLORER_MAX_IMAGE_PIXELS", 64_000_000, 1_000_000)  # width × height, from the header
MAX_IMAGE_SIDE = _setting("ATTN_EXPLORER_MAX_IMAGE_SIDE", 2048, 224)  # longer side after decoding (downscaled)
MAX_UPLOAD_BYTES = _upload_megabytes() * 2**20  # = server.maxUploadSize
# Streamlit keeps every file PUT into a session in memory until the session ends (app/http_guard.py caps it)
MAX_UPLOAD_BYTES_PER_SESSION = _setting("ATTN_EXPLORER_MAX_UPLOAD_MB_PER_SESSION", 100, 1) * 2**20
MAX_UPLOADS_PER_SESSION = _setting("ATTN_EXPLORER_MAX_UPLOADS_PER_SESSION", 10_000, 1)


def max_tokens(device: str) -> int:
    """The highest token limit on ``device``: ``MAX_TOKENS_GPU`` on CUDA (where the run's own check against the
    device's free memory decides what fits), ``MAX_TOKENS`` elsewhere."""
    return MAX_TOKENS_GPU if str(device).startswith("cuda") else MAX_TOKENS


def highest_tokens() -> int:
    """The highest token limit any device of this server offers (what a typed limit is checked against before the
    device is known)."""
    import torch

    return max(MAX_TOKENS, MAX_TOKENS_GPU) if torch.cuda.is_available() else MAX_TOKENS


def max_characters(tokens: int) -> int:
    """Characters read of a text run with a limit of ``tokens`` tokens: enough for the limit, bounded by it."""
    return max(MAX_CHARACTERS, CHARACTERS_PER_TOKEN * int(tokens))


def tokens_that_fit(free_bytes: int, bytes_per_token: int, share: float = 0.8) -> int:
    """How many tokens a run costing ``bytes_per_token`` can have in ``share`` of ``free_bytes``."""
    return int(max(free_bytes, 0) * share // max(1, bytes_per_token))


def summary() -> dict[str, int]:
    """Every limit by name, for the docs and the tests."""
    return {"MAX_TOKENS": MAX_TOKENS, "MAX_TOKENS_GPU": MAX_TOKENS_GPU, "DEFAULT_TOKENS": DEFAULT_TOKENS,
            "MAX_CHARACTERS": MAX_CHARACTERS,
            "MAX_NEW_TOKENS": MAX_NEW_TOKENS, "MAX_IMAGE_PIXELS": MAX_IMAGE_PIXELS, "MAX_IMAGE_SIDE": MAX_IMAGE_SIDE,
            "MAX_UPLOAD_BYTES": MAX_UPLOAD_BYTES, "MAX_UPLOAD_BYTES_PER_SESSION": MAX_UPLOAD_BYTES_PER_SESSION,
            "MAX_UPLOADS_PER_SESSION": MAX_UPLOADS_PER_SESSION}
