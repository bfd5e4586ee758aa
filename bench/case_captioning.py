"""``captioning`` cases (issue 31): the captioning page's speed and the memory of its maps.

- ``captioning_minis``: each of the three minis on a generated scene: the caption (greedy) with every word's attention
  kept, the word → image maps of every word (layers and heads averaged) and the page's default figure (the strip),
  on 2 threads (target ≤ 1 s each). Baseline: the same model's caption alone (no maps, no figure).
- ``captioning_vlm``: a SmolVLM-256M-shaped model with random weights (SigLIP-B/16 at 512 px tiles, 4 × 4 pixel
  shuffle, SmolLM2-135M's 30 layers × 9 heads / 3 key-value heads; a word-level tokenizer, so a small vocabulary), a
  photo cut into its 4 × 4 tiles + thumbnail (1,088 image tokens): a 20-token caption with every token's maps kept
  (``families.run`` + every word's map) against plain ``generate`` of 20 tokens with SDPA (target ≤ 1.5×);
  ``map_bytes`` (what the result holds for its maps: the kept queries and keys, and the masks) against the bytes of
  the kept queries and keys (target ≤ 1.2×), and the peak memory above plain generation.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from bench.measure import alternate, measure_memory, paired
from bench.worker import worker

VLM_TOKENS = 20


def task_captioning_minis(job: dict) -> dict:
    from PIL import Image

    from models import families
    from models.core.inputs import ImageInput
    from models.families.captioning import model as captioning
    from models.minis.captioning import scenes
    from viz import figures

    found = {}
    picture = Image.fromarray(scenes.page_scene(7).image)
    for spec in [s for s in families.specs("captioning") if s.source == "mini"]:
        loaded = families.load(spec)

        def ours(loaded=loaded):
            result = families.run(loaded, ImageInput(picture, "scene 7"))
            captioning.word_attention(result)
            figures.build("caption_strip", result)
            return result

        def baseline(loaded=loaded):
            return captioning.beam_search(loaded.model, captioning._pixel_values(loaded, picture), 1, 40) \
                if loaded.architecture == "show-attend-tell" else _plain_caption(loaded, picture)

        ours()
        ours_s, base_s = alternate(ours, baseline, job["repeats"], "cpu")
        median_ours, median_base, ratio = paired(ours_s, base_s)
        found[loaded.architecture] = {"ours_s": round(median_ours, 4), "baseline_s": round(median_base, 4),
                                      "ratio": round(ratio, 2), "words": len(ours().words),
                                      "ok": bool(median_ours <= 1.0)}
    return {"minis": found, "ours_s": max(v["ours_s"] for v in found.values()),
            "ok": all(v["ok"] for v in found.values())}


def _plain_caption(loaded, picture):
    import torch

    from models.families.captioning import model as captioning
    from models.families.captioning import vlm

    with torch.inference_mode():
        if loaded.architecture == "encoder-decoder":
            return loaded.model.generate(pixel_values=captioning._pixel_values(loaded, picture), max_new_tokens=40,
                                         do_sample=False)
        return loaded.model.generate(**vlm.processor_inputs(loaded, picture, ""), max_new_tokens=40, do_sample=False)


def smolvlm_shaped(folder: Path) -> Path:
    """SmolVLM-256M's architecture with random weights, saved with a processor of its geometry."""
    import torch
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    from tests.captioning_tiny import tokenizer

    specials = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
                *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
    tok = tokenizer(specials)
    text = {"vocab_size": len(tok), "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
            "rope_theta": 100000.0, "tie_word_embeddings": True}
    config = SmolVLMConfig(vision_config={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                                          "num_attention_heads": 12, "image_size": 512, "patch_size": 16},
                           text_config=text, scale_factor=4, image_token_id=tok.convert_tokens_to_ids("<image>"),
                           pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = SmolVLMForConditionalGeneration(config)
    model.generation_config.eos_token_id = None  # a random model would stop at random: always 20 tokens
    model.save_pretrained(folder)
    SmolVLMProcessor(SmolVLMImageProcessor(size={"longest_edge": 2048}, max_image_size={"longest_edge": 512}), tok,
                     SmolVLMVideoProcessor(), image_seq_len=64).save_pretrained(folder)
    return folder


def task_captioning_vlm(job: dict) -> dict:
    import os

    import torch
    import transformers

    from models import families
    from models.core import images
    from models.core.inputs import ImageInput
    from models.families.captioning import model as captioning
    from models.families.captioning import vlm

    folder = Path(job["folder"])
    os.environ["ATTN_EXPLORER_MODEL_DIRS"] = str(folder.parent)
    loaded = families.load(families.custom("captioning", str(folder)))
    plain = transformers.AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="sdpa").eval()
    plain.generation_config.eos_token_id = None
    picture = images.load_sample("coffee").image
    settings = captioning.CaptionSettings(max_new_tokens=VLM_TOKENS)

    def ours():
        result = families.run(loaded, ImageInput(picture, "sample coffee"), settings)
        captioning.word_attention(result)
        return result

    def baseline():
        with torch.inference_mode():
            return plain.generate(**vlm.processor_inputs(loaded, picture, ""), max_new_tokens=VLM_TOKENS,
                                  do_sample=False)

    if job["mode"] == "time":
        result = ours()
        baseline()
        ours_s, base_s = alternate(ours, baseline, job["repeats"], "cpu")
        median_ours, median_base, ratio = paired(ours_s, base_s)
        maps = result.maps("self")
        qk = sum(a.nbytes for a in maps.queries) + sum(a.nbytes for a in maps.keys)
        held = maps.nbytes() + captioning.word_attention(result).nbytes
        return {"ours_s": median_ours, "baseline_s": median_base, "ratio": ratio, "words": len(result.words),
                "image_tokens": result.regions.count, "sequence": len(maps.key_tokens), "qk_bytes": qk,
                "map_bytes": held, "map_ratio": held / qk}
    fn = ours if job["mode"] == "ours" else baseline
    fn()
    memory, _ = measure_memory(fn, "cpu")
    return memory


def case_captioning(repeats: int, threads: int, parts=("minis", "vlm")) -> list[dict]:
    rows = []
    if "minis" in parts:
        minis = worker({"task": "captioning_minis", "repeats": repeats, "threads": threads})
        rows.append({"case": "captioning_minis", "n": 3, **minis,
                     "target": "caption + every word's maps ≤ 1 s, each mini"})
    if "vlm" not in parts:
        return rows
    with tempfile.TemporaryDirectory() as root:
        folder = smolvlm_shaped(Path(root) / "smolvlm-256m-shaped")
        common = {"folder": str(folder), "threads": threads, "repeats": repeats}
        timing = worker({"task": "captioning_vlm", "mode": "time", **common})
        base = worker({"task": "captioning_vlm", "mode": "baseline", **common})
        ours = worker({"task": "captioning_vlm", "mode": "ours", **common})
    rows.append({"case": "captioning_vlm", "n": VLM_TOKENS, **timing, "extra_mb": ours["peak_mb"] - base["peak_mb"],
                 "bytes": timing["map_bytes"], "target": "ratio ≤ 1.5, map_ratio ≤ 1.2",
                 "ok": bool(timing["ratio"] <= 1.5 and timing["map_ratio"] <= 1.2)})
    return rows


if __name__ == "__main__":  # python -m bench.case_captioning [minis] [vlm] (both by default), 2 threads, 3 repeats
    import json
    import sys

    for row in case_captioning(3, 2, tuple(sys.argv[1:]) or ("minis", "vlm")):
        print(json.dumps(row), flush=True)
