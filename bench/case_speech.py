"""``speech`` case: a 10 s clip transcribed by Whisper tiny.en with every map captured, against the plain
transformers transcription of the same clip.

The clip: the English sample clips (sample_data/speech) joined with 0.3 s of silence and cut to 10 s.

- ours: ``families.run`` on the converted tiny.en loaded with the capture attention function: log-mel, the encoder
  under ``capture.recording`` (4 layers × 6 heads of 1,500 × 1,500 frames, kept as q/k), greedy decoding, the
  teacher-forced decoder forward that records decoder and cross-attention, next-token candidates, and word
  timestamps by DTW over the alignment heads;
- baseline: the same weights loaded with ``attn_implementation="sdpa"``: log-mel, encoder, the same greedy decoding
  with its KV cache (``models.families.speech.model.decode``), no capture.

Both are timed alternately in one fresh process (``bench/measure.py``); ratio = the median of the per-repeat ratios.
Target (issue 20): ratio ≤ 1.5 on CPU.
"""
from __future__ import annotations

from bench.measure import alternate, paired
from bench.worker import worker

TARGET = {"ratio": 1.5, "seconds": 10}


def ten_second_clip():
    import numpy as np

    from models.core import audio
    from models.families.speech import model as speech

    pieces = []
    for name in [n for n in speech.samples() if n.startswith("en ")] * 3:
        pieces += [speech.sample_input(name).audio.samples, np.zeros(int(0.3 * audio.SAMPLE_RATE), np.float32)]
    samples = np.concatenate(pieces)[:TARGET["seconds"] * audio.SAMPLE_RATE]
    return audio.Audio(samples, "ten seconds of the English samples", original_seconds=len(samples) / 16000)


def task_speech(job: dict) -> dict:
    import torch
    from transformers import WhisperForConditionalGeneration

    from models import families
    from models.core import audio
    from models.core.inputs import AudioInput
    from models.families.speech import model as speech

    device = job["device"]
    loaded = families.load(families.spec("speech", "whisper-tiny.en"), device)
    plain = WhisperForConditionalGeneration.from_pretrained(loaded.model.name_or_path, attn_implementation="sdpa")
    plain = plain.to(device).eval().requires_grad_(False)
    plain_loaded = type(loaded)(loaded.spec, plain, loaded.tokenizer, device, loaded.dtype)
    inputs = AudioInput(ten_second_clip())
    settings = speech.SpeechSettings()
    prompt = [speech.vocabulary(loaded).start, speech.vocabulary(loaded).no_timestamps]
    produced = {}

    def ours():
        produced["ours"] = families.run(loaded, inputs, settings)

    @torch.inference_mode()
    def baseline():
        features = torch.from_numpy(audio.log_mel(inputs.audio.samples))[None].to(device)
        hidden = plain.model.encoder(features).last_hidden_state
        produced["baseline"] = speech.decode(plain_loaded, hidden, prompt, settings)

    ours(), baseline()  # warm up (first calls allocate)
    ours_s, base_s = alternate(ours, baseline, job["repeats"], device)
    ours_median, base_median, ratio = paired(ours_s, base_s)
    result = produced["ours"]
    assert result.output.output_ids == produced["baseline"], "capture changed the transcript"
    return {"tokens": len(result.output.output_ids), "seconds": inputs.audio.seconds, "ours_s": ours_median,
            "baseline_s": base_median, "ratio": ratio, "text": result.output.text,
            "bytes": int(sum(m.nbytes() for m in result.attention.values()))}


def case_speech(device: str, repeats: int, threads: int) -> dict:
    timing = worker({"task": "speech", "device": device, "repeats": max(repeats, 3), "threads": threads})
    return {"case": "speech", "n": timing["tokens"], "extra_mb": None, **timing, "device": device,
            "threads": threads, "ours": "families.run: transcription with every map captured + word timestamps",
            "baseline": "the same weights with SDPA: log-mel, encoder, the same greedy decoding, no capture",
            "target": f"ratio <= {TARGET['ratio']}", "ok": timing["ratio"] <= TARGET["ratio"]}
