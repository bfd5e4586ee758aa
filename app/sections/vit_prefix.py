"""The ViT page's prefix tokens: what [CLS], DeiT's [DIST] and the registers are for, and where a [DIST] or register
token looks over the patches (it has no pixels, so it is never drawn in the grid)."""
import streamlit as st

from app import display, widgets
from models.families.vit import model as vit
from viz.figures.vit import PrefixQueryOptions

SHARED = ["vit_prefix"]


def show(result, layer: int, head: int | None, drawn: dict) -> None:
    """A chooser over the prefix tokens other than [CLS] and that token's attention over the patches; nothing for a
    model whose only prefix token is [CLS]."""
    names = result.image.prefix_names
    st.caption("Prefix tokens (no pixels, not in the grid): " + "; ".join(
        f"{name}: {vit.prefix_role(name)}" for name in names if name in ("[CLS]", "[DIST]", "[REG0]")))
    others = [name for name in names if name != "[CLS]"]
    if not others:
        return
    if st.session_state.get("vit_prefix") not in others:
        st.session_state.pop("vit_prefix", None)
    token = st.selectbox("Prefix token as the query", others, key="vit_prefix",
                         help="[DIST] (DeiT) or a register: where it looks among the patches")
    c1, c2 = st.columns([1, 2])
    figure = widgets.figure_or_none("prefix_query", result, PrefixQueryOptions(layer=layer, head=head, token=token,
                                                                              **drawn))
    if figure is None:
        return
    with c1:
        display.show(figure, "vit_prefix_query")
    c2.markdown(widgets.plain(f"{token}: {figure.payload()['role']}."))
    c2.caption(f"Share of {token}'s attention on the prefix tokens (not drawn): "
               f"{figure.payload()['prefix_share']:.1%} on average over heads.")
