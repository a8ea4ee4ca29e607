"""One audio file → windows of samples, as an AudioPreprocess says (soundfile decodes, soxr resamples).

    for window in audio_windows(Path("a.wav"), preprocess):   # float32 [T], [C, T] or [T, C]
        ...

The file is read a block at a time and resampled as a stream (soxr.ResampleStream), so a long
recording never sits in memory whole: at most one block and one window. soundfile returns
samples in [-1, 1] (an int16 file's k as k/32768, exactly), which `scale` multiplies (32768
gives the int16 range back). soundfile and soxr are the `audio` extra: without them a clear
error says what to install.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lpt.data.preprocess import AudioPreprocess
from lpt.errors import DataError

SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
BLOCK_FRAMES = 1 << 16  # frames decoded at a time
MAX_WINDOW_BYTES = 1 << 28  # one window of float32 samples at most (256 MiB: 4.5 h of 16 kHz mono)


class BadAudio(Exception):
    """A file that is not decodable audio of a usable form: the message says why, in one line."""


def require_audio_libraries() -> None:
    """A one-line DataError naming the extra to install when soundfile or soxr is missing."""
    missing = []
    for name in ("soundfile", "soxr"):
        try:
            __import__(name)
        except (ImportError, OSError):  # soundfile raises OSError without its libsndfile
            missing.append(name)
    if missing:
        raise DataError(f"reading audio folders needs {' and '.join(missing)}: pip install 'lpt[audio]'")


def audio_rate(path: Path) -> int:
    """The sample rate a file's header declares."""
    import soundfile

    try:
        return int(soundfile.info(str(path)).samplerate)
    except Exception as err:  # noqa: BLE001 - libsndfile's errors come as RuntimeError, LibsndfileError, ...
        raise BadAudio(f"not readable audio ({_one_line(err)})") from None


def audio_windows(path: Path, preprocess: AudioPreprocess) -> Iterator[np.ndarray]:
    """The file's windows, float32, laid out as one sample of the input (without the batch axis)."""
    if preprocess.window * preprocess.channels * 4 > MAX_WINDOW_BYTES:
        raise BadAudio(f"a window of {preprocess.window} samples is larger than lpt reads at once")
    pending = np.zeros((0, preprocess.channels), np.float32)
    skip = produced = 0  # skip: samples a hop longer than the window still jumps over
    for block in _blocks(path, preprocess):
        if skip:
            dropped = min(skip, len(block))
            block, skip = block[dropped:], skip - dropped
        pending = np.concatenate([pending, block]) if len(pending) else block
        while len(pending) >= preprocess.window:
            yield _laid_out(pending[:preprocess.window], preprocess)
            produced += 1
            skip = max(0, preprocess.hop - len(pending))
            pending = pending[preprocess.hop:]
    if produced == 0:  # shorter than one window: zero-padded to one
        if not len(pending):
            raise BadAudio("holds no audio samples")
        padded = np.zeros((preprocess.window, preprocess.channels), np.float32)
        padded[:len(pending)] = pending
        yield _laid_out(padded, preprocess)


def _blocks(path: Path, preprocess: AudioPreprocess) -> Iterator[np.ndarray]:
    """float32 [frames, channels] blocks: decoded, mixed to mono if asked, resampled to the rate."""
    import soundfile
    import soxr

    try:
        sound = soundfile.SoundFile(str(path))
    except Exception as err:  # noqa: BLE001 - see audio_rate
        raise BadAudio(f"not readable audio ({_one_line(err)})") from None
    with sound:
        channels = sound.channels
        if preprocess.mono:
            channels = 1
        elif channels != preprocess.channels:
            raise BadAudio(f"{sound.channels} channel(s), but the model takes {preprocess.channels} (--mono mixes "
                           "them down)")
        rate = sound.samplerate
        target = preprocess.sample_rate or rate
        stream = soxr.ResampleStream(rate, target, channels, dtype="float32") if target != rate else None
        while True:
            try:
                block = sound.read(BLOCK_FRAMES, dtype="float32", always_2d=True)
            except Exception as err:  # noqa: BLE001 - a truncated or corrupt stream fails while decoding
                raise BadAudio(f"corrupt audio ({_one_line(err)})") from None
            last = len(block) < BLOCK_FRAMES
            if preprocess.mono and block.shape[1] > 1:
                block = block.mean(axis=1, keepdims=True, dtype=np.float32)
            if stream is not None:
                block = stream.resample_chunk(block, last=last)
                block = block.reshape(-1, channels)
            if not np.isfinite(block).all():
                raise BadAudio("holds NaN or Inf samples")
            if len(block):
                yield block
            if last:
                return


def _laid_out(window: np.ndarray, preprocess: AudioPreprocess) -> np.ndarray:
    """[T, C] → the input's layout (NT: [T], NCT: [C, T], NTC: [T, C]), scaled."""
    x = window * np.float32(preprocess.scale) if preprocess.scale != 1 else window
    if preprocess.layout == "NT":
        return np.ascontiguousarray(x[:, 0])
    if preprocess.layout == "NCT":
        return np.ascontiguousarray(x.T)
    return np.ascontiguousarray(x)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
