"""Speech audio for Whisper: any file a user brings, decoded to 16 kHz mono, and its log-mel spectrogram.

Decoding: ``soundfile`` (libsndfile: WAV, FLAC, MP3, OGG/Vorbis/Opus) reads at most the first 30 s (Whisper reads
30 s windows), channels are averaged to mono, and the rate is changed to 16 kHz by polyphase filtering
(``scipy.signal.resample_poly``). Everything that changed the audio is said in ``notes``; audio that cannot be used
raises ``ValueError`` with what to do.

Log-mel spectrogram (Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision", §2.2): the
audio padded with zeros (or cut) to 30 s; a 25 ms Hann window (400 samples) every 10 ms (160 samples), centred with
reflection at the edges, the last frame dropped (3,000 frames); power spectrum; 80 triangular mel filters (128 for
large-v3 and its turbo: the model's ``num_mel_bins``) between 0 and 8 kHz on Slaney's mel scale with Slaney's area
normalisation; log10 clamped at 1e-10, floored at 8 below its maximum (80 dB of range), then (x + 4) / 4. No filter
file ships, so the filters are computed here.
"""
from __future__ import annotations

import hashlib
import io
import math
import re
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

SAMPLE_RATE = 16_000  # Hz, what Whisper was trained on
N_FFT = 400  # 25 ms window
HOP = 160  # 10 ms between frames
N_MELS = 80  # Whisper tiny … large-v2; large-v3 and large-v3-turbo read 128
CHUNK_SECONDS = 30  # Whisper reads one 30 s window
CHUNK_SAMPLES = SAMPLE_RATE * CHUNK_SECONDS  # 480,000
MEL_FRAMES = CHUNK_SAMPLES // HOP  # 3,000 spectrogram frames
ENCODER_FRAMES = MEL_FRAMES // 2  # 1,500: the encoder's second convolution has stride 2 (20 ms per frame)
SECONDS_PER_ENCODER_FRAME = 2 * HOP / SAMPLE_RATE  # 0.02 s
FORMATS = ("wav", "flac", "mp3", "ogg")


@dataclass(frozen=True, eq=False)
class Audio:
    """Decoded speech: ``samples`` float32 mono at 16 kHz (at most 30 s), and what decoding changed."""

    samples: np.ndarray
    name: str = "audio"  # "sample hello_world", "upload", "recording": never a user's file name
    notes: tuple[str, ...] = ()
    original_rate: int = SAMPLE_RATE
    original_channels: int = 1
    original_seconds: float = 0.0  # the file's whole length, before any cut

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    @cached_property
    def fingerprint(self) -> str:
        return hashlib.sha1(np.ascontiguousarray(self.samples).tobytes()).hexdigest()

    def wav_bytes(self) -> bytes:
        """The 16 kHz mono audio as a 16-bit WAV file (what the page plays back)."""
        import soundfile

        buffer = io.BytesIO()
        soundfile.write(buffer, self.samples, SAMPLE_RATE, format="WAV", subtype="PCM_16")
        return buffer.getvalue()


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    if seconds >= 60:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{seconds:.1f} s"


def decode(data: bytes, name: str = "audio") -> Audio:
    """An audio file's bytes -> ``Audio`` (16 kHz mono, the first 30 s); unusable audio raises ``ValueError``."""
    import soundfile

    if not data:
        raise ValueError("The audio file is empty (0 bytes). Record again or upload a WAV, FLAC, MP3 or OGG file.")
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as sound:
            rate, channels, frames = sound.samplerate, sound.channels, sound.frames
            if rate <= 0 or channels <= 0:
                raise ValueError(f"The audio header says {rate} Hz and {channels} channels, which cannot be "
                                 "played. The file is damaged; export it again.")
            samples = sound.read(frames=min(frames, CHUNK_SECONDS * rate) if frames > 0 else -1,
                                 dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError, TypeError, EOFError) as error:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        reason = re.sub(r"^Error opening .*?>: ", "", reason).rstrip(".")  # libsndfile names our in-memory buffer
        raise ValueError(f"This file could not be read as audio ({reason}). Upload a WAV, FLAC, MP3 or OGG file; "
                         "a file renamed to .wav is not audio, and a damaged header cannot be read.") from error
    samples = samples[:CHUNK_SECONDS * rate]
    if samples.shape[0] == 0:
        raise ValueError("The audio holds 0 s of sound. Record or upload at least a second of speech.")
    notes = []
    original_seconds = max(frames, samples.shape[0]) / rate
    if original_seconds > CHUNK_SECONDS + 1e-6:
        notes.append(f"The audio is {_duration(original_seconds)} long; only its first {CHUNK_SECONDS} s are "
                     "transcribed (Whisper reads one 30 s window).")
    if not np.isfinite(samples).all():
        samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
        notes.append("The file holds values that are not numbers (NaN or infinite); they were set to silence.")
    if channels > 1:
        samples = samples.mean(axis=1, keepdims=True)
        notes.append(f"{channels} channels were mixed down to one (mono).")
    mono = samples[:, 0]
    if rate != SAMPLE_RATE:
        mono = resample(mono, rate)
        notes.append(f"Resampled from {rate:,} Hz to {SAMPLE_RATE:,} Hz."
                     + (f" Recorded at {rate:,} Hz, it holds nothing above {rate / 2000:g} kHz, which Whisper "
                        "rarely heard in training: expect more mistakes." if rate < SAMPLE_RATE else ""))
    if len(mono) < HOP:
        raise ValueError(f"The audio is {len(mono) / SAMPLE_RATE * 1000:.0f} ms long: too short to hold speech. "
                         "Record or upload at least a second.")
    return Audio(np.ascontiguousarray(mono, dtype=np.float32), name, tuple(notes), rate, channels, original_seconds)


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """``samples`` at ``rate`` Hz -> 16 kHz, polyphase filtering with a Kaiser window (float32)."""
    from scipy.signal import resample_poly

    divisor = math.gcd(int(rate), SAMPLE_RATE)
    return resample_poly(samples, SAMPLE_RATE // divisor, int(rate) // divisor).astype(np.float32)


# --- the log-mel spectrogram ------------------------------------------------------------------------------------

def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (the Auditory Toolbox): linear below 1 kHz (3 mel per 200 Hz), logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = 3.0 * hz / 200.0
    logarithmic = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * 27.0 / np.log(6.4)
    return np.where(hz >= 1000.0, logarithmic, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0), 200.0 * mel / 3.0)


@cache
def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``(n_mels, n_fft // 2 + 1)`` triangular filters from 0 Hz to rate / 2, each of unit area (Slaney norm)."""
    bin_hz = np.linspace(0.0, rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(rate / 2), n_mels + 2))  # (n_mels + 2,)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bin_hz[None] - lower) / (centre - lower)
    falling = (upper - bin_hz[None]) / (upper - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return (triangles * (2.0 / (upper - lower))).astype(np.float32)


def log_mel(samples: np.ndarray, n_mels: int = N_MELS) -> np.ndarray:
    """``(n_mels, 3000)`` float32 log-mel spectrogram of 16 kHz mono ``samples`` padded or cut to 30 s."""
    import torch

    audio = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
    clip = np.asarray(samples, dtype=np.float32)[:CHUNK_SAMPLES]
    audio[:len(clip)] = clip
    window = torch.hann_window(N_FFT, dtype=torch.float64)  # periodic, as numpy/torch STFTs use
    spectrum = torch.stft(torch.from_numpy(audio).double(), N_FFT, HOP, window=window, center=True,
                          pad_mode="reflect", return_complex=True)  # (201, 3001)
    power = spectrum[:, :-1].abs() ** 2  # (201, 3000): the frame past the end is dropped
    mel = torch.from_numpy(mel_filters(n_mels).astype(np.float64)) @ power  # (n_mels, 3000)
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).float().numpy()


def content_frames(samples: np.ndarray) -> int:
    """Encoder frames (20 ms each) that hold the audio rather than the padding, at least 1."""
    return max(1, min(ENCODER_FRAMES, math.ceil(len(samples) / (2 * HOP))))
