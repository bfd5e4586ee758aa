"""Box average precision for the mini DETR (PASCAL VOC / COCO style): per class, detections ranked by score are
matched greedily to unmatched ground-truth boxes of that class with IoU ≥ a threshold; AP is the area under the
all-point interpolated precision–recall curve; mAP averages the classes that have ground truth."""
from __future__ import annotations

import numpy as np


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` (n, 4) with every box in ``b`` (m, 4), boxes as x0, y0, x1, y1: ``(n, m)``."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    x0 = np.maximum(a[:, None, 0], b[None, :, 0])
    y0 = np.maximum(a[:, None, 1], b[None, :, 1])
    x1 = np.minimum(a[:, None, 2], b[None, :, 2])
    y1 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = lambda boxes: (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def average_precision(detections: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                      truths: list[tuple[np.ndarray, np.ndarray]], num_classes: int,
                      iou_threshold: float = 0.5) -> tuple[float, list[float]]:
    """mAP and per-class AP. ``detections[i]`` = (boxes (n, 4), scores (n,), labels (n,)) of image i;
    ``truths[i]`` = (boxes (m, 4), labels (m,)). A class without ground truth gets NaN and is left out of the mean."""
    per_class = []
    for cls in range(num_classes):
        ranked, positives = [], 0
        for image, ((boxes, scores, labels), (true_boxes, true_labels)) in enumerate(zip(detections, truths)):
            positives += int((true_labels == cls).sum())
            ranked += [(float(s), image, box) for box, s, l in zip(boxes, scores, labels) if l == cls]
        if positives == 0:
            per_class.append(float("nan"))
            continue
        ranked.sort(key=lambda item: -item[0])
        used = {i: np.zeros(int((t[1] == cls).sum()), dtype=bool) for i, t in enumerate(truths)}
        hits = np.zeros(len(ranked))
        for k, (_, image, box) in enumerate(ranked):
            true_boxes, true_labels = truths[image]
            candidates = true_boxes[true_labels == cls]
            if not len(candidates):
                continue
            ious = box_iou(box[None], candidates)[0]
            ious[used[image]] = -1.0
            best = int(ious.argmax())
            if ious[best] >= iou_threshold:
                used[image][best] = True
                hits[k] = 1
        true_positives = np.cumsum(hits)
        recall = true_positives / positives
        precision = true_positives / np.arange(1, len(ranked) + 1)
        # all-point interpolation: precision made monotone from the right, integrated over recall
        recall = np.concatenate([[0.0], recall, [recall[-1] if len(recall) else 0.0]])
        precision = np.concatenate([[1.0], precision, [0.0]])
        precision = np.maximum.accumulate(precision[::-1])[::-1]
        per_class.append(float(np.sum((recall[1:] - recall[:-1]) * precision[1:])))
    valid = [ap for ap in per_class if not np.isnan(ap)]
    return (float(np.mean(valid)) if valid else float("nan")), per_class


def duplicates(detections: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
               truths: list[tuple[np.ndarray, np.ndarray]], threshold: float = 0.5,
               iou_threshold: float = 0.5) -> dict[str, float]:
    """How often one object is found by more than one query, what DETR's set loss should make rare.

    Every detection with score ≥ ``threshold`` (the page's score threshold) is given to the true object it overlaps
    most, when that IoU is ≥ ``iou_threshold`` (whatever the classes: two boxes on one object are a duplicate even
    when they disagree on its class). Returns ``per_found_object``: detections per object that has at least one
    (1.0: no duplicates), ``duplicated_share``: the share of all true objects with two or more, ``found_share``:
    the share with at least one, and ``per_object``: all detections ≥ ``threshold`` over all true objects."""
    counts, above = [], 0
    for (boxes, scores, _), (true_boxes, _) in zip(detections, truths):
        kept = np.asarray(boxes).reshape(-1, 4)[np.asarray(scores) >= threshold]
        above += len(kept)
        per_object = np.zeros(len(true_boxes), dtype=int)
        if len(kept) and len(true_boxes):
            ious = box_iou(kept, true_boxes)  # (kept, objects)
            best = ious.argmax(1)
            np.add.at(per_object, best[ious.max(1) >= iou_threshold], 1)
        counts.append(per_object)
    counts = np.concatenate(counts) if counts else np.zeros(0, dtype=int)
    if not len(counts):
        raise ValueError("no true objects to count duplicates on")
    found = counts[counts > 0]
    return {"per_found_object": float(found.mean()) if len(found) else float("nan"),
            "duplicated_share": float((counts > 1).mean()), "found_share": float((counts > 0).mean()),
            "per_object": above / len(counts)}
