"""The image picker the vision pages share (ViT, Swin): a sample photo, an upload, or the camera.

Decoding and every check live in ``models.core.images`` (formats, EXIF orientation, bombs, tiny images, downscaling); this
widget only reads the choice, shows what was changed in words, and shows a bad file as ``st.error`` so the page keeps
working. The page gets a ``models.core.inputs.ImageInput`` named ``sample cat``, ``upload`` or ``camera``: an upload's own
file name never reaches a link or a file name. The upload limit is ``server.maxUploadSize`` in .streamlit/config.toml
(25 MB, = images.MAX_FILE_BYTES).
"""
from __future__ import annotations

import streamlit as st

from app.widgets import show_error
from models.core import images
from models.core.inputs import ImageInput

SOURCES = ("Sample photo", "Upload", "Camera")
UPLOAD_TYPES = ["png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff"]


def shared_keys(key: str = "image") -> list[str]:
    """The picker's state that a shareable link carries: the source and the sample's name, never an upload."""
    return [f"{key}_source", f"{key}_sample"]


def input_label(key: str = "image") -> str:
    """How the chosen image is named in file names: ``sample cat``, or ``upload`` / ``camera`` (what a user
    uploaded never goes into a link or a file name)."""
    source = st.session_state.get(f"{key}_source", SOURCES[0])
    if source == SOURCES[0]:
        return f"sample {st.session_state.get(f'{key}_sample', '')}".strip()
    return str(source).lower()


def image_picker(key: str = "image", default_sample: str = "cat") -> ImageInput | None:
    """Show the picker and return the chosen image, 8-bit RGB (≤ 2048 px a side) and named by ``input_label``, or None.

    ``key`` keeps two pickers on one page apart. None means nothing usable was given yet (no upload, no photo, or a
    file that could not be read; its error is already on the page).
    """
    source = st.radio("Image", SOURCES, horizontal=True, key=f"{key}_source",
                      help="A CC0 sample photo, your own file (PNG, JPEG, WebP, BMP, GIF, TIFF; up to "
                           f"{images.MAX_FILE_BYTES // 2**20} MB), or a picture from your camera.")
    if source == "Sample photo":
        chosen_key = f"{key}_sample"
        if st.session_state.get(chosen_key) not in images.SAMPLES:
            st.session_state[chosen_key] = default_sample
        columns = st.columns(len(images.SAMPLES))
        for column, name in zip(columns, images.sample_names()):
            selected = st.session_state[chosen_key] == name
            if column.button(name, key=f"{key}_sample_{name}", type="primary" if selected else "secondary",
                             width="stretch"):
                st.session_state[chosen_key] = name
                st.rerun()
        try:
            picked = images.load_sample(st.session_state[chosen_key])
        except (ValueError, OSError) as error:
            show_error(f"The sample photo could not be read: {error}")
            return None
        st.caption(f"Sample photo '{st.session_state[chosen_key]}' ({picked.size[0]} × {picked.size[1]}), "
                   "CC0 / public domain via scikit-image (sample_data/images/LICENSES).")
        return ImageInput(picked.image, input_label(key))

    if source == "Upload":
        upload = st.file_uploader("Your image", type=UPLOAD_TYPES, key=f"{key}_upload")
        if upload is None:
            st.info("Upload an image to look at, or switch to a sample photo.")
            return None
        data, name = upload.getvalue(), "The uploaded file"
    else:
        shot = st.camera_input("Take a picture", key=f"{key}_camera")
        if shot is None:
            st.info("Allow camera access in your browser and take a picture, or switch to a sample photo.")
            return None
        data, name = shot.getvalue(), "The camera picture"

    try:
        picked = images.decode_image(data, name)
    except ValueError as error:
        show_error(str(error))
        return None
    described = f"{picked.source_format}, {picked.size[0]} × {picked.size[1]} pixels"
    if picked.notes:
        described += " — " + "; ".join(picked.notes)
    st.caption(described)  # what decoding changed is said here, so the input carries the picture alone
    return ImageInput(picked.image, input_label(key))
