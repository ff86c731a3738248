#!/usr/bin/env python3
"""Build the reference log-mel features that media/tests/whisper_features.rs checks (issue 21).

Pinned reference stack (the versions the committed fixtures were generated with):

    torch        == 2.15.0
    transformers == 5.24.0
    numpy        == 2.4.6

Run by hand, once, by whoever changes the fixtures; CI never runs it:

    ~/.cache/mlxkit/fixtures-venv/bin/python scripts/make_audio_fixtures.py

It writes, under media/tests/fixtures/whisper_features/:

    speech_16k.wav       1.31 s of seeded synthetic "speech" (a gliding harmonic voice, noise
                         bursts, a silent gap) as 16-bit PCM at 16 kHz
    tones_44k.wav        0.8 s at 44.1 kHz, 32-bit float: tones and low-passed noise, all under
                         6 kHz, faded in and out with raised-cosine ramps, so the signal is
                         band-limited and the same formula sampled at 16 kHz is its ideal
                         resampling (shifted by half an input sample, where rubato's output
                         sits)
    <case>.f32           little-endian f32 log-mel columns [feature_size, stored_frames]: the
                         first frames of transformers' [feature_size, 3000] output; every later
                         frame holds only padding and is checked (here) to equal
                         `padding_value` exactly
    <case>.f64path.f32   the same columns from the extractor's numpy path (f64 throughout),
                         rounded to f32 once: the exact features, for a tighter bound
    manifest.json        cases, versions, and what was measured while generating

Each case is WhisperFeatureExtractor(feature_size=N) called as a processor calls it
(padding="max_length", truncation, return_attention_mask=True), which takes the torch path
(torch.stft in f32) when torch is installed, as here. The numpy path (f64 STFT and filters) is
run on the same padded input and its distance from the torch path is recorded.
"""

from __future__ import annotations

import json
import struct
import wave
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import WhisperFeatureExtractor

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT = REPO_ROOT / "media" / "tests" / "fixtures" / "whisper_features"
# Where media::resample's output sample k sits in a 44.1 kHz input, beyond k / 16000 s.
RUBATO_SHIFT_S = 0.5 / 44100


def write_wav(path: Path, samples: np.ndarray, rate: int) -> np.ndarray:
    """16-bit mono PCM; returns the samples as a WAV reader gets them back (int16 / 32768)."""
    pcm = np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return pcm.astype(np.float32) / np.float32(32768.0)


def write_float_wav(path: Path, samples: np.ndarray, rate: int) -> np.ndarray:
    """32-bit float mono (format tag 3, which Python's `wave` does not write), so no
    quantization noise sits between the signal and its ideal resampling."""
    data = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return samples.astype(np.float32)


def speech(rate: int, n: int) -> np.ndarray:
    rng = np.random.RandomState(2024)
    t = np.arange(n) / rate
    pitch = 140.0 + 60.0 * np.sin(2 * np.pi * 1.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 30))
    voice *= 0.5 * (1 + np.sin(2 * np.pi * 3.1 * t))
    noise = rng.normal(0.0, 1.0, n) * (np.sin(2 * np.pi * 2.3 * t) > 0.6)
    x = 0.12 * voice + 0.05 * noise
    x[int(0.55 * rate) : int(0.7 * rate)] = 0.0  # a pause: exact zeros
    return x


def tones(t: np.ndarray, duration: float) -> np.ndarray:
    """Band-limited under 6 kHz, evaluated at any sample times `t` (seconds)."""
    freqs = [220.0, 587.3, 1250.0, 2890.0, 4410.0, 5730.0]
    amps = [0.20, 0.15, 0.10, 0.06, 0.04, 0.03]
    x = sum(a * np.sin(2 * np.pi * f * t + i) for i, (f, a) in enumerate(zip(freqs, amps)))
    # Raised-cosine fades of 0.1 s: smooth, so the envelope adds no content above a few Hz.
    ramp = 0.1
    env = np.ones_like(t)
    head = t < ramp
    env[head] = 0.5 - 0.5 * np.cos(np.pi * t[head] / ramp)
    tail = t > duration - ramp
    env[tail] = 0.5 - 0.5 * np.cos(np.pi * (duration - t[tail]) / ramp)
    env[(t < 0) | (t > duration)] = 0.0
    return x * env


def extract(samples: np.ndarray, feature_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    fe = WhisperFeatureExtractor(feature_size=feature_size)
    out = fe(
        samples,
        sampling_rate=16000,
        padding="max_length",
        truncation=True,
        return_attention_mask=True,
        return_tensors="np",
    )
    feats = out["input_features"][0]
    valid = int(out["attention_mask"][0].sum())
    padded = np.zeros(fe.n_samples, dtype=np.float32)
    padded[: min(len(samples), fe.n_samples)] = samples[: fe.n_samples]
    numpy_path = fe._np_extract_fbank_features(padded[None, :], "cpu")[0]
    return feats, numpy_path, valid


def main() -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    rate = 16000
    clip16 = write_wav(OUT / "speech_16k.wav", speech(rate, 20917), rate)

    duration, rate44 = 0.8, 44100
    n44 = int(duration * rate44)
    write_float_wav(OUT / "tones_44k.wav", tones(np.arange(n44) / rate44, duration), rate44)
    # The ideal 16 kHz version: the same formula at 16 kHz, as many samples as a resampler
    # returns (ceil(len · 16000 / 44100)). media's resampler (rubato's synchronous FFT
    # resampler) places output sample k half an input sample late in the input's time
    # (k / 16000 + 0.5 / 44100 s: measured 0.4997 input samples by fitting each tone's phase),
    # so the formula is sampled there; at k / 16000 the features differ by 4.8e-2, all of it
    # that 11 µs shift.
    n16 = -(-n44 * rate // rate44)
    ideal16 = tones(np.arange(n16) / rate + RUBATO_SHIFT_S, duration).astype(np.float32)

    cases = []
    for name, samples, wav, bins, source in [
        ("speech_16k_80", clip16, "speech_16k.wav", 80, "the WAV's samples"),
        ("speech_16k_128", clip16, "speech_16k.wav", 128, "the WAV's samples"),
        ("tones_44k_80", ideal16, "tones_44k.wav", 80, "the ideal 16 kHz signal"),
    ]:
        feats, numpy_path, valid = extract(samples, bins)
        assert feats.shape == (bins, 3000), feats.shape
        # Frames from this one on see only the zeros padding the clip to 30 s.
        first_padding = -(-(len(samples) + 200) // 160) + 1
        rest = feats[:, first_padding:]
        padding_value = float(rest[0, 0])
        assert np.all(rest == np.float32(padding_value)), "padding frames differ"
        assert np.all(numpy_path[:, first_padding:] == padding_value), "f64 padding differs"
        stored = feats[:, :first_padding].astype("<f4")
        (OUT / f"{name}.f32").write_bytes(np.ascontiguousarray(stored).tobytes())
        exact = numpy_path[:, :first_padding].astype("<f4")
        (OUT / f"{name}.f64path.f32").write_bytes(np.ascontiguousarray(exact).tobytes())
        cases.append(
            {
                "name": name,
                "wav": wav,
                "features_from": source,
                "feature_size": bins,
                "samples_at_16k": len(samples),
                "frames": 3000,
                "stored_frames": first_padding,
                "valid_frames": valid,
                "padding_value": padding_value,
                "file": f"{name}.f32",
                "numpy_f64_file": f"{name}.f64path.f32",
                "torch_vs_numpy_f64_max_abs_diff": float(np.abs(feats - numpy_path).max()),
                "max": float(feats.max()),
                "min": float(feats.min()),
            }
        )
        print(name, cases[-1])

    manifest = {
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "extractor": "WhisperFeatureExtractor(feature_size=N), padding='max_length', "
        "truncation=True, return_attention_mask=True (the torch path: torch is installed)",
        "cases": cases,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
