"""What a user gives a family's ``run``: a text or an image, with what names it in caches and file names.

Inputs are frozen and know their own cache key, so the app caches every family's runs with one function
(app/resources.py) and the CLI builds them from its flags.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from PIL import Image

from models.core import limits
from models.core.audio import Audio
from models.core.images import UserImage


@dataclass(frozen=True)
class TextInput:
    """A text and the token limit it is cut to (or, for translation, refused beyond)."""

    text: str
    max_tokens: int = limits.DEFAULT_TOKENS

    @property
    def key(self) -> tuple:
        return ("text", self.text, self.max_tokens)

    @property
    def name(self) -> str:
        """How the input is named in file names: its first 40 characters."""
        return self.text[:40]


@dataclass(frozen=True, eq=False)
class ImageInput:
    """A decoded image (``models.core.images.UserImage`` or an RGB ``PIL.Image``) and how it is named in file names:
    ``sample cat``, ``upload``, ``camera`` (what a user uploaded is never put in a link or a file name)."""

    image: UserImage | Image.Image
    name: str = "image"

    @property
    def pil(self) -> Image.Image:
        return self.image.image if isinstance(self.image, UserImage) else self.image

    @cached_property
    def fingerprint(self) -> str:
        """A digest of the pixels: the same picture uploaded twice is one cache entry."""
        picture = self.pil
        return hashlib.sha1(picture.tobytes()).hexdigest() + f"{picture.size}{picture.mode}"

    @property
    def key(self) -> tuple:
        return ("image", self.fingerprint)

    @property
    def notes(self) -> tuple[str, ...]:
        """What decoding changed (downscaled, rotated by its EXIF tag, ...), for the page's notices."""
        return self.image.notes if isinstance(self.image, UserImage) else ()


@dataclass(frozen=True, eq=False)
class AudioInput:
    """Decoded speech (``models.core.audio.Audio``: 16 kHz mono, at most 30 s) and how it is named in file names:
    ``sample en hello_world``, ``upload``, ``recording`` (never a user's own file name)."""

    audio: Audio

    @property
    def name(self) -> str:
        return self.audio.name

    @property
    def key(self) -> tuple:
        return ("audio", self.audio.fingerprint)

    @property
    def notes(self) -> tuple[str, ...]:
        return self.audio.notes
