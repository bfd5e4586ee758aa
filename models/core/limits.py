"""The app's deliberate limits in one place, each overridable by an environment variable (see docs/LIMITS.md).

The app runs on shared lab servers that a room of students opens at once, so every request's memory and time are
bounded. What each limit bounds:

- tokens N: a text run keeps each layer's queries and keys, ``layers × (heads + kv_heads) × N × head_dim × 4``
  bytes (SmolLM2 at N = 8192: 30 × (9 + 3) × 8192 × 64 × 4 B ≈ 0.75 GB), and a viewed layer's weights
  ``heads × N² × 4`` bytes (9 × 8192² × 4 B ≈ 2.4 GB); the sidebar's token limit cannot exceed ``MAX_TOKENS``;
- characters: text beyond ``MAX_CHARACTERS`` is not even tokenised (tokenising 10 MB of text takes seconds);
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


MAX_TOKENS = _setting("ATTN_EXPLORER_MAX_TOKENS", 8192, 16)  # highest token limit the sidebar offers
DEFAULT_TOKENS = min(512, MAX_TOKENS)  # the sidebar's token limit when a page opens
MAX_CHARACTERS = _setting("ATTN_EXPLORER_MAX_CHARACTERS", 200_000, 1_000)  # text beyond this is not tokenised
MAX_NEW_TOKENS = _setting("ATTN_EXPLORER_MAX_NEW_TOKENS", 256, 1)  # generation length
MAX_IMAGE_PIXELS = _setting("ATTN_EXPLORER_MAX_IMAGE_PIXELS", 64_000_000, 1_000_000)  # width × height, from the header
MAX_IMAGE_SIDE = _setting("ATTN_EXPLORER_MAX_IMAGE_SIDE", 2048, 224)  # longer side after decoding (downscaled)
MAX_UPLOAD_BYTES = _upload_megabytes() * 2**20  # = server.maxUploadSize
# Streamlit keeps every file PUT into a session in memory until the session ends (app/http_guard.py caps it)
MAX_UPLOAD_BYTES_PER_SESSION = _setting("ATTN_EXPLORER_MAX_UPLOAD_MB_PER_SESSION", 100, 1) * 2**20
MAX_UPLOADS_PER_SESSION = _setting("ATTN_EXPLORER_MAX_UPLOADS_PER_SESSION", 10_000, 1)


def summary() -> dict[str, int]:
    """Every limit by name, for the docs and the tests."""
    return {"MAX_TOKENS": MAX_TOKENS, "DEFAULT_TOKENS": DEFAULT_TOKENS, "MAX_CHARACTERS": MAX_CHARACTERS,
            "MAX_NEW_TOKENS": MAX_NEW_TOKENS, "MAX_IMAGE_PIXELS": MAX_IMAGE_PIXELS, "MAX_IMAGE_SIDE": MAX_IMAGE_SIDE,
            "MAX_UPLOAD_BYTES": MAX_UPLOAD_BYTES, "MAX_UPLOAD_BYTES_PER_SESSION": MAX_UPLOAD_BYTES_PER_SESSION,
            "MAX_UPLOADS_PER_SESSION": MAX_UPLOADS_PER_SESSION}
