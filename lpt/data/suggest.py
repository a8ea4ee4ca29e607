"""What data options suit a model's inputs: `lpt inspect` prints these lines.

    for line in suggest(model):
        print(line)

An input of rank 4 with 1 or 3 channels (NCHW or NHWC) looks like an image; a float or int16 input [N, T] / [N, C, T] whose T is unknown or at least
400 samples looks like audio. For each, the options lpt would infer (lpt.data.preprocess) and a
command line. A preprocessing recorded in the model (lpt.preprocess) is shown as it is.
"""

from __future__ import annotations

import numpy as np

from lpt.data.preprocess import METADATA_KEY, PRESETS, AudioOptions, ImageOptions, from_json, resolve_audio, resolve_image
from lpt.errors import DataError


def suggest(model) -> list[str]:
    """One or two lines per image- or audio-like input of `model` (an ir.Model)."""
    from lpt.calibration.data import input_specs

    lines = []
    recorded = model.metadata_props.get(METADATA_KEY)
    if recorded is not None:
        try:
            preprocess = from_json(recorded, "the model")
            lines.append(f"calibrated on a folder of {preprocess.kind} files, preprocessing recorded ({METADATA_KEY}): "
                         f"{preprocess.describe()}; lpt compare/run/quantize --data DIR reuse it")
        except DataError as err:
            lines.append(str(err))
    specs = input_specs(model)
    for spec in specs:
        if _image_like(spec):
            try:
                image = resolve_image(ImageOptions(), spec)
            except DataError:
                continue
            h, w = image.size
            lines.append(f"input {spec.name!r} {spec.describe()} looks like an image: --data DIR (a folder of "
                         f"JPEG/PNG/WebP, class subfolders for labels) would be read as {image.describe()}")
            lines.append(f"  e.g. --data photos/ as inferred, or --preprocess {'|'.join(PRESETS)} (imagenet: resize "
                         f"{round(min(h, w) * 256 / 224)} + center crop; yolo: letterbox), --resize, --crop, --mean, "
                         "--std, --scale")
        elif _audio_like(spec):
            window = "" if spec.shape[-1] is not None and spec.shape[1] is not None else " --window 16000"
            try:
                audio = resolve_audio(AudioOptions(window=16000) if window else AudioOptions(), spec)
            except DataError:
                continue
            lines.append(f"input {spec.name!r} {spec.describe()} looks like audio: --data DIR (WAV/FLAC/OGG) would be "
                         f"read as {audio.describe()}")
            lines.append(f"  e.g. --data clips/ --sample-rate 16000{window} (the rate the model was trained at; "
                         "files are resampled to it)")
    if len(specs) > 1 and len(lines) > (recorded is not None):
        lines.append("  a folder feeds a single-input model; for several inputs use a .npz or lpt.Dataset")
    return lines


def _image_like(spec) -> bool:
    shape = spec.shape
    if shape is None or spec.dtype.kind not in "fu":
        return False
    return len(shape) == 4 and (shape[1] in (1, 3) or shape[3] in (1, 3))  # [N, H, W] is told apart only by --layout NHW


def _audio_like(spec) -> bool:
    shape = spec.shape
    if shape is None or not (spec.dtype.kind == "f" or spec.dtype == np.int16) or len(shape) not in (2, 3):
        return False
    time = shape[-1] if len(shape) == 2 or (shape[1] is not None and shape[1] <= 8) else shape[1]
    return time is None or time >= 400
