"""Representative inputs for the real-model corpus (bench/corpus.tsv), made here, deterministically.

Each model gets samples shaped exactly as the corpus table's example feed (batch 1, fixed
values as given), built from what its "input kind" column says. Sample i uses seed i, so the
32 calibration samples (0..31) and the 16 evaluation samples (32..47) are different.

- image, NCHW: photos that scikit-image ships (astronaut, coffee, chelsea, rocket, the stereo
  motorcycle, camera, coins, and the scanned page, gray ones repeated over RGB), each sample
  a different random crop (40-100% of the side), maybe mirrored, resized to the input's H×W,
  then scaled as the kind says: ImageNet mean/std on x/255, or (x/255-0.5)/0.5.
- text line (ppocr rec, ddddocr): one line of `skimage.data.page()` (lines found by their
  darkness), with a random margin above and below and a random stretch of it, resized to
  48×320 (RGB) or 64×256 (gray).
- audio: synthetic speech-like audio (`speech_like`): syllables of a harmonic series on a
  pitch gliding between 80 and 300 Hz, shaped by three gliding formants (Gaussian bumps over
  the harmonics) and a 1/k spectral tilt, under a raised-cosine syllable envelope; fricative
  noise bursts (first-differenced white noise), silences, and a -60 dB noise floor. Peak 0.3-0.9
  (×32767 where the kind says "int16 range"). Short inputs (silero's 512 samples, openWakeWord's
  1280) are a random window of a one-second clip, so some fall on silence.
- LSTM state (`state`): zeros; a fixed value in the feed (`sr=16000`): that value, 0-d.
- mel frames (NHWC) and embeddings (openWakeWord): the real upstream chain run by onnxruntime
  on the synthetic audio: oww_melspectrogram (on int16-range audio), then `x/10 + 2` as
  openWakeWord does, then 76-frame windows for oww_embedding_model, and for the wake-word
  models 16 embeddings of windows 8 frames apart (1.96 s of audio).
- log-mel frames (DNSMOS P.808): 120-band Slaney mel power spectrogram of 16 kHz audio
  (n_fft 321, hop 160, centered, Hann), in dB relative to its maximum floored at -80 dB, then
  (dB+40)/40, as speechmos computes it with librosa (here in numpy).
- spectrogram frames (PLCMOS): log power of a 512-point Hamming STFT, hop 256, over 1/20,
  as speechmos computes it; `rater_embed` is standard normal, as speechmos draws it.
- file bytes (magika): a synthetic "file" of random length (100-6000 bytes) made of runs of
  text-like bytes (words, spaces, newlines, punctuation), random bytes and 0x00/0xFF runs;
  the first 1024 and last 1024 bytes, padded with 256 where the file is shorter, as int32.

A model whose kind says "already quantized" gets the inputs of the row with the same example
feed (ddddocr_common_old_dynq: those of ddddocr_common).

`stack(samples, shapes)` turns a list of samples into the `.npz` form lpt reads: each input
concatenated along its batch axis (axis 1 for an input whose model shape fixes axis 0 to more
than 1 and leaves a later axis free, e.g. silero's state [2, B, 128]), 0-d inputs given once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pathlib import Path

import numpy as np

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "stereo_motorcycle", "camera", "coins", "page")
OWW_MEL, OWW_EMBEDDING = "oww_melspectrogram", "oww_embedding_model"  # the openWakeWord chain


class MissingPackage(RuntimeError):
    """A bench-only package these inputs need is not installed (the message says what to install)."""


@dataclass(frozen=True)
class Feed:
    """One input of the table's example feed: `name:1,3,48,320:float32`, `sr::int64=16000`."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    value: float | None = None

    @classmethod
    def parse_all(cls, text: str) -> list[Feed]:
        feeds = []
        for part in text.split(";"):
            # input names may hold ':' (tf2onnx's "serving_default_input_2:0"): split from the right
            spec, _, value = part.partition("=")
            name, dims, dtype = spec.rsplit(":", 2)
            shape = tuple(int(d) for d in dims.split(",")) if dims else ()
            feeds.append(cls(name, shape, np.dtype(dtype), float(value) if value else None))
        return feeds


@dataclass(frozen=True)
class Recipe:
    """How to make one model's samples: its example feed and its input kind."""

    feeds: list[Feed]
    kind: str


def make_samples(recipe: Recipe, seeds: range, upstream: Callable[[str], str] | None = None) -> list[dict]:
    """One feed dict per seed, each input shaped as the example feed; `upstream(name)` is the path of a
    corpus model this one's inputs are computed with (openWakeWord's chain)."""
    make = _sample_maker(recipe, upstream)
    return [make(seed) for seed in seeds]


def batch_axis(model_shape) -> int | None:
    """Where samples stack for one input: None for a 0-d input, 1 when the model fixes axis 0 to
    more than 1 and leaves a later axis free (an RNN state [2, B, 128]), else 0."""
    if model_shape is not None and len(model_shape) == 0:
        return None
    if model_shape and isinstance(model_shape[0], int) and model_shape[0] > 1:
        free = [i for i, d in enumerate(model_shape) if not isinstance(d, int)]
        if free:
            return free[0]
    return 0


def stack(samples: list[dict], model_shapes: dict[str, list]) -> dict[str, np.ndarray]:
    """Samples → one dict of arrays keyed by input name, stacked along each input's batch axis."""
    out = {}
    for name in samples[0]:
        axis = batch_axis(model_shapes.get(name))
        parts = [s[name] for s in samples]
        out[name] = parts[0] if axis is None or parts[0].ndim == 0 else np.concatenate(parts, axis=axis)
    return out


# -- dispatch on the input kind


def _sample_maker(recipe: Recipe, upstream) -> Callable[[int], dict]:
    kind, feeds = recipe.kind, recipe.feeds
    if "image" in kind:
        (feed,) = feeds
        text_line = "text line" in kind
        scale = _imagenet if "ImageNet" in kind else _half_range
        return lambda seed: {feed.name: scale(_image(feed.shape, seed, text_line)).astype(feed.dtype)}
    if "file bytes" in kind:
        (feed,) = feeds
        return lambda seed: {feed.name: _file_bytes(feed.shape, seed).astype(feed.dtype)}
    if "mel frames (NHWC)" in kind:
        (feed,) = feeds
        chain = _WakeWordChain(upstream)
        return lambda seed: {feed.name: chain.mel_window(seed, feed.shape[1]).reshape(feed.shape).astype(feed.dtype)}
    if "embeddings" in kind:
        (feed,) = feeds
        chain = _WakeWordChain(upstream)
        return lambda seed: {feed.name: chain.embeddings(seed, feed.shape[1]).reshape(feed.shape).astype(feed.dtype)}
    if "log-mel frames" in kind:
        (feed,) = feeds
        return lambda seed: {feed.name: _dnsmos_logmel(seed, feed.shape[1], feed.shape[2])[None].astype(feed.dtype)}
    if "spectrogram frames" in kind:
        spectrum, embed = feeds
        return lambda seed: {spectrum.name: _plcmos_spectrum(seed, spectrum.shape).astype(spectrum.dtype),
                             embed.name: np.random.default_rng([seed, 1]).normal(size=embed.shape).astype(embed.dtype)}
    if "audio" in kind:
        rate = _sample_rate(kind)
        gain = 32767.0 if "int16" in kind else 1.0
        return lambda seed: {f.name: _audio_input(f, seed, rate, gain) for f in feeds}
    raise ValueError(f"no recipe for input kind {kind!r}")


def _sample_rate(kind: str) -> int:
    match = re.search(r"([\d.]+) kHz", kind)
    if not match:
        raise ValueError(f"input kind {kind!r} names no sample rate (e.g. '16 kHz')")
    return round(float(match.group(1)) * 1000)


def _audio_input(feed: Feed, seed: int, rate: int, gain: float) -> np.ndarray:
    if feed.value is not None:
        return np.array(feed.value, dtype=feed.dtype).reshape(feed.shape)
    if feed.name == "state":
        return np.zeros(feed.shape, feed.dtype)
    length = int(np.prod(feed.shape))
    if length < rate:  # a short window: cut from a one-second clip, maybe on silence
        clip = speech_like(rate, rate, seed)
        start = np.random.default_rng([seed, 2]).integers(0, rate - length)
        audio = clip[start:start + length]
    else:
        audio = speech_like(length, rate, seed)
    return (audio * gain).reshape(feed.shape).astype(feed.dtype)


# -- audio


def speech_like(n: int, rate: int, seed: int) -> np.ndarray:
    """n samples of speech-like audio at `rate` Hz (see the module docstring), float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    # Pitch and formant targets every 0.1-0.4 s, linearly glided between.
    knots = np.cumsum(rng.uniform(0.1, 0.4, size=int(n / rate / 0.1) + 3)) - 0.2
    f0 = np.interp(t, knots, rng.uniform(80, 300, knots.size))
    formants = [np.interp(t, knots, rng.uniform(lo, hi, knots.size))
                for lo, hi in ((300, 900), (900, 2400), (2300, 3300))]
    phase = 2 * np.pi * np.cumsum(f0) / rate
    step = max(1, rate // 400)  # harmonic gains change slowly: computed every 2.5 ms, then held
    coarse_f0, coarse_formants = f0[::step], [f[::step] for f in formants]
    voiced = np.zeros(n)
    for k in range(1, 41):
        frequency = k * coarse_f0
        gain = sum(np.exp(-0.5 * ((frequency - f) / width) ** 2) for f, width in zip(coarse_formants, (90, 130, 180)))
        gain = (gain + 0.05) / k * (frequency < 0.45 * rate)
        voiced += np.repeat(gain, step)[:n] * np.sin(k * phase)
    voiced /= np.abs(voiced).max() + 1e-9

    envelope, fricative = np.zeros(n), np.zeros(n)
    position = int(rng.uniform(0, 0.2) * rate)
    while position < n:
        event = rng.choice(["syllable", "syllable", "syllable", "burst", "silence"])
        length = int(rate * {"syllable": rng.uniform(0.1, 0.35), "burst": rng.uniform(0.04, 0.15),
                             "silence": rng.uniform(0.05, 0.4)}[event])
        end = min(n, position + length)
        window = np.sin(np.linspace(0, np.pi, length))[: end - position] ** 2
        if event == "syllable":
            envelope[position:end] = window * rng.uniform(0.4, 1.0)
        elif event == "burst":
            fricative[position:end] = window * rng.uniform(0.1, 0.4)
        position = end + int(rng.uniform(0, 0.05) * rate)
    noise = np.diff(rng.normal(size=n + 1)) / 2  # first difference: a high-frequency hiss
    audio = voiced * envelope + noise * fricative + rng.normal(scale=1e-3, size=n)
    audio *= rng.uniform(0.3, 0.9) / (np.abs(audio).max() + 1e-9)
    return audio.astype(np.float32)


def _mel_filterbank(rate: int, n_fft: int, bands: int) -> np.ndarray:
    """Slaney-style mel filters with Slaney area normalization (librosa's defaults), [bands, n_fft//2+1]."""
    def to_mel(f):
        f = np.asarray(f, np.float64)
        return np.where(f < 1000, f / (200 / 3), 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27))

    def to_hz(m):
        return np.where(m < 15, m * (200 / 3), 1000 * np.exp((m - 15) * (np.log(6.4) / 27)))

    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    edges = to_hz(np.linspace(to_mel(0), to_mel(rate / 2), bands + 2))
    ramps = edges[:, None] - bins[None, :]
    widths = np.diff(edges)
    lower, upper = -ramps[:-2] / widths[:-1, None], ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def _dnsmos_logmel(seed: int, frames: int, bands: int, rate: int = 16000) -> np.ndarray:
    """[frames, bands]: speechmos's DNSMOS P.808 features (librosa melspectrogram, power_to_db(ref=max))."""
    n_fft, hop = 321, 160
    audio = speech_like(frames * hop, rate, seed).astype(np.float64)
    padded = np.pad(audio, n_fft // 2)
    starts = np.arange(frames) * hop
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    spectrum = np.abs(np.fft.rfft(padded[starts[:, None] + np.arange(n_fft)] * window, axis=1)) ** 2
    mel = spectrum @ _mel_filterbank(rate, n_fft, bands).T
    db = 10 * np.log10(np.maximum(mel, 1e-10))
    db = np.maximum(db - db.max(), -80.0)
    return (db + 40) / 40


def _plcmos_spectrum(seed: int, shape: tuple[int, ...], rate: int = 16000) -> np.ndarray:
    """[1, 1, frames, 257]: speechmos's PLCMOS features, log(|STFT|²)/20 (Hamming 512, hop 256)."""
    frames, size, hop = shape[2], 512, 256
    audio = speech_like((frames - 1) * hop, rate, seed).astype(np.float64)
    padded = np.zeros((frames - 1) * hop + size)
    padded[size - hop: size - hop + audio.size] = audio
    window = np.hamming(size + 1)[:-1]
    power = np.abs(np.fft.rfft(padded[np.arange(frames)[:, None] * hop + np.arange(size)] * window, axis=1)) ** 2
    floor = power[power > 0].min() * 10 ** (-120 / 10)
    return (np.log(np.maximum(power, floor)) / 20).reshape(shape)


class _WakeWordChain:
    """openWakeWord's feature chain, run by onnxruntime on synthetic audio: mel → embeddings."""

    def __init__(self, upstream):
        import onnxruntime as ort

        if upstream is None:
            raise ValueError("the openWakeWord inputs need the upstream models' paths")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self.mel = ort.InferenceSession(upstream(OWW_MEL), options, providers=["CPUExecutionProvider"])
        self._upstream, self._options, self._embedding = upstream, options, None

    def spectrogram(self, seed: int, seconds: float) -> np.ndarray:
        """[frames, 32], as openWakeWord feeds its embedding model (x/10 + 2)."""
        audio = speech_like(int(16000 * seconds), 16000, seed) * 32767
        out = self.mel.run(None, {self.mel.get_inputs()[0].name: audio[None].astype(np.float32)})[0]
        return out.reshape(-1, 32) / 10 + 2

    def mel_window(self, seed: int, frames: int) -> np.ndarray:
        spectrogram = self.spectrogram(seed, 1.2)
        start = np.random.default_rng([seed, 3]).integers(0, len(spectrogram) - frames + 1)
        return spectrogram[start:start + frames]

    def embeddings(self, seed: int, count: int, window: int = 76, step: int = 8) -> np.ndarray:
        import onnxruntime as ort

        if self._embedding is None:
            self._embedding = ort.InferenceSession(self._upstream(OWW_EMBEDDING), self._options,
                                                   providers=["CPUExecutionProvider"])
        spectrogram = self.spectrogram(seed, ((count - 1) * step + window) / 100 + 0.05)
        windows = np.stack([spectrogram[i * step: i * step + window] for i in range(count)])[..., None]
        out = self._embedding.run(None, {self._embedding.get_inputs()[0].name: windows.astype(np.float32)})[0]
        return out.reshape(count, -1)


# -- images


def _skimage_data():
    try:
        import skimage.data
        import skimage.transform
    except ImportError:
        raise MissingPackage("image inputs need scikit-image: pip install scikit-image") from None
    return skimage


def _photo(name: str) -> np.ndarray:
    skimage = _skimage_data()
    image = getattr(skimage.data, name)()
    image = image[0] if isinstance(image, tuple) else image  # stereo_motorcycle: (left, right, disparity)
    return np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image[..., :3]


def _image(shape: tuple[int, ...], seed: int, text_line: bool) -> np.ndarray:
    """[1, C, H, W] float in 0..255: a random crop of a photo, or a strip of text."""
    skimage = _skimage_data()
    _, channels, height, width = shape
    crop = _crop(seed, text_line, width / height)
    resized = skimage.transform.resize(crop, (height, width), anti_aliasing=True, preserve_range=True)
    if channels == 1:
        resized = resized.mean(axis=2, keepdims=True)
    return resized.transpose(2, 0, 1)[None].astype(np.float32)


def photo_folder(folder: Path, seeds: range, text_line: bool, aspect: float) -> Path:
    """`folder` filled with one JPEG per seed (quality 92, 8-bit RGB): the crop _image would make, not
    resized, so that lpt's image loader (lpt.data) decodes, resizes and scales it as a user's photos.
    `aspect` (width / height of the model's input) shapes a text line's crop as _image does."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        crop = _crop(seed, text_line, aspect)
        Image.fromarray(np.ascontiguousarray(crop, dtype=np.uint8)).save(folder / f"{seed:03d}.jpg", quality=92)
    return folder


def _crop(seed: int, text_line: bool, aspect: float) -> np.ndarray:
    """The [H, W, 3] uint8 crop of sample `seed`: a line of the scanned page, or part of a photo."""
    rng = np.random.default_rng(seed)
    if text_line:
        source = _photo("page")
        rows = _text_rows(source)
        top, bottom = rows[rng.integers(0, len(rows))]
        margin = (bottom - top) * rng.uniform(0.2, 0.6)
        top, bottom = max(0, int(top - margin)), min(source.shape[0], int(bottom + margin))
        length = min(source.shape[1], int((bottom - top) * aspect * rng.uniform(0.8, 1.3)))
        left = rng.integers(0, source.shape[1] - length + 1)
        return source[top:bottom, left:left + length]
    source = _photo(PHOTOS[seed % len(PHOTOS)])
    rows, cols = source.shape[:2]
    side = rng.uniform(0.4, 1.0)
    crop_rows, crop_cols = int(rows * side), int(cols * side)
    top, left = rng.integers(0, rows - crop_rows + 1), rng.integers(0, cols - crop_cols + 1)
    crop = source[top:top + crop_rows, left:left + crop_cols]
    return crop[:, ::-1] if rng.random() < 0.5 else crop


def _text_rows(page: np.ndarray) -> list[tuple[int, int]]:
    """(top, bottom) of each line of text: rows darker than the rolling lightest of their neighbourhood."""
    darkness = np.convolve(255 - page.mean(axis=(1, 2)), np.ones(3) / 3, "same")
    padded = np.pad(darkness, 12, mode="edge")
    baseline = np.array([padded[i:i + 25].min() for i in range(darkness.size)])
    inked = np.flatnonzero(darkness - baseline > 15)
    groups = np.split(inked, np.flatnonzero(np.diff(inked) > 1) + 1)
    return [(int(g[0]), int(g[-1]) + 1) for g in groups if g.size >= 5]


def _imagenet(x: np.ndarray) -> np.ndarray:
    return (x / 255 - IMAGENET_MEAN[:, None, None]) / IMAGENET_STD[:, None, None]


def _half_range(x: np.ndarray) -> np.ndarray:
    return (x / 255 - 0.5) / 0.5


# -- bytes


def _file_bytes(shape: tuple[int, ...], seed: int, half: int = 1024) -> np.ndarray:
    """[1, 2048]: first and last `half` bytes of a synthetic file, 256 where it runs short."""
    rng = np.random.default_rng(seed)
    words = [b"the", b"model", b"import", b"return", b"data", b"int8", b"=", b"{", b"}", b"(x)", b"0.5", b"def"]
    parts, size, target = [], 0, int(rng.uniform(100, 6000))
    while size < target:
        kind = rng.choice(["text", "text", "random", "fill"])
        if kind == "text":
            run = b" ".join(words[i] for i in rng.integers(0, len(words), rng.integers(5, 60)))
            run += b"\n" * int(rng.integers(0, 3))
        elif kind == "random":
            run = rng.integers(0, 256, rng.integers(16, 400)).astype(np.uint8).tobytes()
        else:
            run = bytes([int(rng.choice([0, 255]))]) * int(rng.integers(8, 200))
        parts.append(run)
        size += len(run)
    content = np.frombuffer(b"".join(parts)[:target], np.uint8).astype(np.int32)
    begin = np.full(half, 256, np.int32)
    end = np.full(half, 256, np.int32)
    begin[: min(half, content.size)] = content[:half]
    tail = content[-half:]
    end[half - tail.size:] = tail
    return np.concatenate([begin, end]).reshape(shape)
