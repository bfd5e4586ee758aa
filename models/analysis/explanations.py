"""The analyses of the explanation views, for any family with an adapter: which module turns a
family's loaded model and run into an ``Explainable`` (models/analysis/attribution.py), and the
``f(loaded, result, options)`` functions the views name (docs/ARCHITECTURE.md, "Add a view").

Adapters: each family declares its own (``Family.explainer``:
``models/families/<name>/explain.py``). The shared methods never know which library a family uses.

Progress: ``with reporting(callback):`` around a call makes the long analyses report
``callback(step, fraction)`` (the page draws a progress bar from it; nothing here imports
Streamlit)."""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Callable

from models.analysis import faithfulness as faithfulness_analysis
from models.analysis.attribution import Explainable
from models.analysis.pixels import ExplainedClass, per_patch
from models.core import selection

_progress: contextvars.ContextVar[Callable[[str, float], None] | None] = contextvars.ContextVar("progress",
                                                                                                default=None)


@contextmanager
def reporting(callback: Callable[[str, float], None]):
    """Route the analyses' progress (``step`` in words, ``fraction`` 0..1) to ``callback`` inside
    the block."""
    token = _progress.set(callback)
    try:
        yield
    finally:
        _progress.reset(token)


def report(step: str, fraction: float) -> None:
    callback = _progress.get()
    if callback is not None:
        callback(step, fraction)


def adapter(loaded):
    """The family's explanation adapter (``Family.explainer``, declared in its folder's
    ``__init__.py``)."""
    from models import families

    family = families.get(loaded.spec.family)
    if family.explainer is None:
        explained = [name for name, other in families.FAMILIES.items() if other.explainer is not None]
        raise ValueError(f"explanations and faithfulness curves are not available for the {family.name} family yet "
                         f"(they are for: {', '.join(explained)})")
    return family.explainer


def explainable(loaded, result, target, replacement: str = "mean") -> Explainable:
    return adapter(loaded).from_result(loaded, result, target, replacement)


def faithfulness(loaded, result, options) -> faithfulness_analysis.Faithfulness:
    """The faithfulness view's analysis: every method's map for ``options.target`` and its deletion
    and insertion curves against ``options.seeds`` random orders."""
    ex = explainable(loaded, result, options.token or options.target, options.replacement)
    layer, head = raw_attention(getattr(options, "layer", selection.LAST), getattr(options, "head", selection.MEAN))
    return faithfulness_analysis.faithfulness(ex, result.model.key, result.input_name, steps=options.steps,
                                              seeds=options.seeds, ig_steps=options.ig_steps, progress=report,
                                              result=result, layer=layer, head=head)


def raw_attention(layer, head) -> tuple[int | None, int | None]:
    """Raw attention's layer and head as the methods read them (a layer counted from the end when negative, None
    for every layer averaged; a head, None for the mean) from a choice (``models/core/selection.py``): the number
    of layers is the explained model's, known only once it runs."""
    if layer == selection.ALL:
        index = None
    elif layer in (selection.LAST, selection.OPENING):
        index = -1
    else:
        index = int(layer)
    return index, None if head == selection.MEAN else int(head)


def localisation(loaded, result, options):
    """The localisation view's analysis: the pointing game and IoU on held-out generated shapes
    (the mini ViT)."""
    return adapter(loaded).localisation(loaded, options.images, options.seed, ig_steps=options.ig_steps,
                                        progress=report)


def class_attribution(loaded, result, options) -> ExplainedClass:
    """The attribution view's analysis (image families): ``options.method`` for class
    ``options.target`` (None: the top prediction) with ``options.steps``, on the crop ``result``
    saw; a windowed model's rollout beside it (a Swin's run has no single-sequence rollout to
    compare with)."""
    from models.analysis import attribution as attribution_analysis

    if not result.predictions:
        raise ValueError(result.explanation or
                         "this model has no classifier, so there is no class to attribute")
    target = result.predictions[0].token_id if options.target is None else options.target
    ex = explainable(loaded, result, target)
    windowed = ex.layout is not None
    methods = tuple(dict.fromkeys((options.method, *(("rollout",) if windowed else ()))))
    found = attribution_analysis.explain(ex, methods, max(2, options.steps), progress=report)
    rolled = found.scores["rollout"].reshape(result.image.patch_grid) if windowed else None
    explained = per_patch(result, found, options.method, target, ex.target_name)
    return ExplainedClass(result, explained, rolled)


def attribution(loaded, result, options):
    """The token attribution view's analysis: one method's map (``options.method``) for
    ``options.target`` / ``options.token`` on a text family, with the adapter it was computed on
    (for its unit names and target)."""
    from models.analysis import attribution as attribution_analysis

    ex = explainable(loaded, result, options.token or options.target, options.replacement)
    found = attribution_analysis.explain(ex, (options.method,), options.ig_steps, progress=report)
    return ex, found, loaded.spec.key
