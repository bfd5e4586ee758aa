"""The lecture's own numbers for ViT-B/16 at 224 px, computed by the cost tab, beside the page's with-[CLS] count."""
from __future__ import annotations

from models.lessons import cost


def test_the_lectures_patch_only_count_beside_the_with_cls_count():
    vit = next(e for e in cost.worked_examples() if e.title == "ViT-B/16 on a 224×224 image")
    rows = {row.label: row for row in vit.rows}
    patches = rows["one map over the 196 patches only (the lecture's 14⁴)"]
    assert patches.entries == 14 ** 4 == 196 ** 2 == 38_416
    assert patches.bytes == 38_416 * 4 == 153_664  # "about 150 KB": 150.06 KiB
    grid = rows["one map over 256 patches (a 16 × 16 grid)"]
    assert grid.entries == 65_536 and grid.bytes == 262_144 == 256 * 1024
    assert rows["one map with [CLS] (197 tokens, one head, one layer)"].entries == 197 ** 2 == 38_809
    table = {row["what"]: row for row in cost.example_table(vit)}
    assert table["one map over the 196 patches only (the lecture's 14⁴)"]["binary"] == "150.06 KiB"
    assert table["one map over 256 patches (a 16 × 16 grid)"]["binary"] == "256 KiB"
    assert "38{,}416" in vit.latex and "38{,}809" in vit.latex and r"\qquad " in vit.latex


def test_the_calculator_note_says_both():
    note = cost.lecture_vit_note()
    assert "38,416" in note and "38,809" in note and "150.06 KiB" in note and "N = 197" in note
