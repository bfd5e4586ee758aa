"""The ViT page's high-norm patches: which patches leave the last layer with an outlier norm, why a ViT without
registers makes them and why attention maps light up there (Darcet et al. 2024, "Vision Transformers Need
Registers"), with their norms as a histogram and a table."""
import streamlit as st

from app import display, tables, widgets

SHARED = ["vit_mark_high_norm", "vit_high_norm_in_scale"]


def controls(left=st, right=st) -> dict:
    """The two display settings of the high-norm patches, as keyword arguments of ``HighNormOptions``."""
    return {"mark_high_norm": left.toggle("Outline high-norm patches", True, key="vit_mark_high_norm",
                                           help="Patches whose output norm is an outlier (see 'High-norm patches' "
                                                "under the [CLS] view)"),
            "high_norm_in_scale": right.toggle("High-norm patches in the colour scale", False,
                                               key="vit_high_norm_in_scale",
                                               help="Off: the other patches set the colours, so a few outliers "
                                                    "cannot wash out the rest of the map")}


def show(result) -> None:
    """The explanation, the norms' histogram and the flagged patches' table."""
    figure = widgets.figure_or_none("patch_norms", result)
    if figure is None:
        return
    flagged = figure.payload()["high_norm_patches"]
    st.markdown("**High-norm patches.** " + (
        f"{len(flagged)} patches (outlined in white on the maps) leave the last layer with a norm far above the other "
        "patches'. Darcet et al. (2024, “Vision Transformers Need Registers”) found such tokens in ViTs trained long "
        "enough, DINOv2 among them: patches of little content, often background, that the model recycles as scratch "
        "space for information about the whole image, dropping what they showed. [CLS] and the other patches read "
        "from them, so attention maps light up there: an artefact of the model, not a part of the object. By "
        "default they are left out of the colour scale (under Display), so they cannot wash out the rest."
        if flagged else "No patch leaves the last layer with an outlier norm on this image, so no patch is outlined."))
    st.caption("The cure the paper proposes is **registers**: a few extra tokens with no pixels that take over the "
               "scratch-space role, after which the maps lose these artefacts. "
               + ("This model has registers (" + ", ".join(n for n in result.image.prefix_names if "REG" in n) + ")."
                  if any("REG" in n for n in result.image.prefix_names) else
                  "This model has none; `vit_small_patch14_reg4_dinov2` (hub, in the model list) is DINOv2 ViT-S "
                  "trained with 4 registers, to compare when you have internet."))
    left, right = st.columns([3, 2])
    with left:
        display.show(figure, "vit_norms")
    table = figure.table()
    tables.show(table[table["high-norm"]] if flagged else table.head(5), {"norm": "%.1f", "modified z": "%.1f"},
                where=right)
