"""Preprocessing of images and audio: the user's options, named presets, and the resolved form.

    options = ImageOptions(preset="imagenet")             # what the user said (None: not said)
    image = resolve_image(options, spec)                   # + what the model's input shape says
    image.describe()  # "resize shorter side to 256, center crop 224x224, RGB, NCHW, x/255, mean ..., std ..."

Options left out are inferred from the input the data feeds: its layout (NCHW when dim 1 holds 1 or 3
channels, NHWC when the last dim does), colour (1 channel: L, 3: RGB), size (H, W) and, for audio,
the window length (its time dim) and channels. What was inferred is listed in `notes`, so the CLI
can print what it chose. A resolved preprocessing is written into the FQ model's metadata_props
under METADATA_KEY as JSON (`to_json`), and read back (`from_json`) when the same model later runs
on a folder given without options: one preprocessing for calibration and evaluation.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction

from lpt.errors import DataError

METADATA_KEY = "lpt.preprocess"

LAYOUTS = ("NCHW", "NHWC", "NHW")  # NHW: a grayscale input without a channel axis
COLORS = ("RGB", "BGR", "L")
CROPS = ("center", "none")
LETTERBOX_FILL = 114  # YOLO's grey, in 8-bit pixel values

# Named presets: the values each fills in where the user did not give one. Sizes come from the model
# (imagenet resizes the shorter side to 256/224 of the crop, as torchvision's reference scripts do).
PRESETS: dict[str, dict] = {
    "imagenet": {"crop": "center", "resize_ratio": 256 / 224, "scale": 1 / 255, "color": "RGB",
                 "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)},
    "yolo": {"letterbox": True, "scale": 1 / 255, "color": "RGB", "mean": (0.0,), "std": (1.0,)},
    "minus1to1": {"scale": 1 / 255, "mean": (0.5,), "std": (0.5,)},  # (x/255 - 0.5) / 0.5 in [-1, 1]
    "unit": {"scale": 1 / 255, "mean": (0.0,), "std": (1.0,)},  # x/255 in [0, 1]
    "raw": {"scale": 1.0, "mean": (0.0,), "std": (1.0,)},  # the pixel values 0..255 as they are
}


@dataclass(frozen=True)
class ImageOptions:
    """What the user asked for; None where they said nothing (resolve_image fills it in).

    resize: an int (the shorter side, aspect kept, then cropped) or (height, width) (exactly);
    scale multiplies the decoded pixel values (0..255, or 0..65535 in 16-bit files) before
    (x - mean) / std."""

    preset: str | None = None
    resize: int | tuple[int, int] | None = None
    crop: str | None = None
    letterbox: bool | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale: float | None = None
    layout: str | None = None
    color: str | None = None

    @property
    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


@dataclass(frozen=True)
class AudioOptions:
    """What the user asked for; None where they said nothing (resolve_audio fills it in). `scale`
    multiplies the decoded samples ([-1, 1]; 32768 gives the int16 range)."""

    sample_rate: int | None = None
    mono: bool | None = None
    window: int | None = None
    hop: int | None = None
    scale: float | None = None

    @property
    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


@dataclass(frozen=True)
class ImagePreprocess:
    """One image → one sample of `input`: decode, `color`, resize (letterbox / shorter side + crop /
    straight to `size`), x·scale (None: 1/255 for 8-bit files, 1/65535 for 16-bit), (x - mean) / std,
    `layout`."""

    input: str
    size: tuple[int, int]  # (height, width) the model takes
    resize: int | tuple[int, int] | None
    crop: str
    letterbox: bool
    scale: float | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    layout: str
    color: str
    notes: tuple[str, ...] = field(default=(), compare=False)  # what was inferred, for the CLI to print

    kind = "image"

    @property
    def channels(self) -> int:
        return 1 if self.color == "L" else 3

    def describe(self) -> str:
        h, w = self.size
        if self.letterbox:
            geometry = f"letterbox into {h}x{w} (fill {LETTERBOX_FILL})"
        elif isinstance(self.resize, int):
            geometry = f"resize shorter side to {self.resize}, " + (
                f"center crop {h}x{w}" if self.crop == "center" else f"then to {h}x{w}")
        elif self.crop == "center":
            geometry = f"resize to cover {h}x{w}, center crop {h}x{w}"
        else:
            geometry = f"resize to {h}x{w}"
        scale = "x/255 (x/65535 for 16-bit files)" if self.scale is None else f"x*{_number(self.scale)}"
        return (f"{geometry}, {self.color}, {self.layout}, {scale}, mean {_numbers(self.mean)}, "
                f"std {_numbers(self.std)}")

    def to_json(self) -> str:
        values = {k: v for k, v in asdict(self).items() if k != "notes"}
        return json.dumps({"kind": self.kind, **values}, sort_keys=True)


@dataclass(frozen=True)
class AudioPreprocess:
    """One file → windows of `window` samples every `hop` for `input`: decode to [-1, 1], mix to mono
    (if `mono`), resample to `sample_rate` (soxr; None: the files' own rate), x·scale; a file shorter
    than a window is zero-padded to one, and a last partial window dropped. `layout`: NT (no channel
    axis), NCT or NTC."""

    input: str
    sample_rate: int | None
    mono: bool
    channels: int
    window: int
    hop: int
    scale: float
    layout: str
    notes: tuple[str, ...] = field(default=(), compare=False)

    kind = "audio"

    def describe(self) -> str:
        rate = "the files' own rate" if self.sample_rate is None else f"{self.sample_rate} Hz (soxr)"
        channels = "mono" if self.mono else f"{self.channels} channel{'s' if self.channels > 1 else ''}"
        return (f"{rate}, {channels}, windows of {self.window} samples every {self.hop}, x*{_number(self.scale)}, "
                f"{self.layout}")

    def to_json(self) -> str:
        values = {k: v for k, v in asdict(self).items() if k != "notes"}
        return json.dumps({"kind": self.kind, **values}, sort_keys=True)


def from_json(text: str, where: str) -> ImagePreprocess | AudioPreprocess:
    """A preprocessing written by to_json (a model's metadata), or a DataError naming `where`."""
    try:
        values = json.loads(text)
        kind = values.pop("kind")
        cls = {"image": ImagePreprocess, "audio": AudioPreprocess}[kind]
        names = {f.name for f in fields(cls)} - {"notes"}
        if set(values) != names:
            raise ValueError(f"keys {sorted(values)}")
        for key in ("size", "mean", "std"):
            if key in values:
                values[key] = tuple(values[key])
        if isinstance(values.get("resize"), list):
            values["resize"] = tuple(values["resize"])
        return cls(**values)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise DataError(f"{where}: its {METADATA_KEY} metadata is not a preprocessing lpt wrote ({err})") from None


# -- parsing the CLI's values (one-line DataErrors naming the option)


def parse_number(text: str, option: str) -> float:
    """A positive number, or a fraction such as 1/255."""
    try:
        value = float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise DataError(f"{option} {text!r}: expected a number or a fraction such as 1/255") from None
    if not math.isfinite(value) or value <= 0:
        raise DataError(f"{option} {text!r}: must be positive")
    return value


def parse_numbers(text: str, option: str, positive: bool = False) -> tuple[float, ...]:
    """One value or one per channel, comma-separated: "0.485,0.456,0.406"."""
    values = []
    for part in text.split(","):
        try:
            value = float(Fraction(part.strip()))
        except (ValueError, ZeroDivisionError):
            raise DataError(f"{option} {text!r}: expected one number or one per channel, comma-separated") from None
        if not math.isfinite(value) or (positive and value <= 0):
            raise DataError(f"{option} {text!r}: every value must be {'positive' if positive else 'finite'}")
        values.append(value)
    if len(values) not in (1, 3):
        raise DataError(f"{option} {text!r}: give one value, or three (one per RGB channel)")
    return tuple(values)


def parse_size(text: str, option: str = "--resize") -> int | tuple[int, int]:
    """"256" (the shorter side) or "224x224" / "224,224" (height x width)."""
    parts = text.lower().replace(",", "x").split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise DataError(f"{option} {text!r}: expected N (the shorter side) or HxW, e.g. 256 or 224x224") from None
    if len(values) not in (1, 2) or min(values) < 1:
        raise DataError(f"{option} {text!r}: expected N (the shorter side) or HxW, e.g. 256 or 224x224")
    return values[0] if len(values) == 1 else (values[0], values[1])


# -- resolution against the model's input


def resolve_image(options: ImageOptions, spec) -> ImagePreprocess:
    """`options` completed from the preset and from `spec` (an lpt.calibration.data.InputSpec of rank
    3 or 4); a DataError when they contradict the input or leave its size unknown."""
    notes = []
    preset = {}
    if options.preset is not None:
        if options.preset not in PRESETS:
            raise DataError(f"--preprocess {options.preset!r}: choose one of {', '.join(PRESETS)}")
        preset = PRESETS[options.preset]
    shape = spec.shape
    if shape is None or len(shape) not in (3, 4):
        raise DataError(f"input {spec.name!r} {spec.describe()} is not an image input ([N,C,H,W], [N,H,W,C] or "
                        "[N,H,W]): images cannot feed it")
    layout = options.layout
    if layout is None:
        layout = _image_layout(shape)
        notes.append(f"layout {layout}")
    elif layout not in LAYOUTS:
        raise DataError(f"--layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    if (layout == "NHW") != (len(shape) == 3):
        raise DataError(f"--layout {layout}: input {spec.name!r} is {spec.describe()}, of rank {len(shape)}")
    h_axis, w_axis, c_axis = {"NCHW": (2, 3, 1), "NHWC": (1, 2, 3), "NHW": (1, 2, None)}[layout]
    channels = 1 if c_axis is None else shape[c_axis]
    color = options.color or (preset.get("color") if channels != 1 else None)  # a preset's RGB is not for grey
    if color is None:
        if channels not in (1, 3, None):
            raise DataError(f"input {spec.name!r} {spec.describe()} has {channels} channels in {layout}: images give "
                            "1 (L) or 3 (RGB, BGR)")
        color = "L" if channels == 1 else "RGB"
        notes.append(f"color {color}")
    elif color not in COLORS:
        raise DataError(f"--color {color!r}: choose one of {', '.join(COLORS)}")
    if channels is not None and channels != (1 if color == "L" else 3):
        raise DataError(f"--color {color} gives {1 if color == 'L' else 3} channel(s), but input {spec.name!r} "
                        f"{spec.describe()} takes {channels} ({layout})")

    resize = options.resize
    letterbox = bool(options.letterbox if options.letterbox is not None else preset.get("letterbox", False))
    fixed = (shape[h_axis], shape[w_axis])
    if None in fixed:
        if not isinstance(resize, tuple):
            raise DataError(f"input {spec.name!r} {spec.describe()} does not fix the image size: give it with "
                            "--resize HxW (e.g. --resize 224x224)")
        size = resize
        resize = None
    else:
        size = fixed
        notes.append(f"size {size[0]}x{size[1]}")
        if isinstance(resize, tuple) and resize == size:
            resize = None
    crop = options.crop or preset.get("crop")
    if crop is not None and crop not in CROPS:
        raise DataError(f"--crop {crop!r}: choose one of {', '.join(CROPS)}")
    if letterbox:
        if crop == "center" and options.crop is not None:
            raise DataError("--letterbox and --crop center exclude each other: letterbox keeps the whole image")
        if resize is not None:
            raise DataError("--letterbox and --resize exclude each other: letterbox scales to the model's size")
        crop = "none"
    if resize is None and "resize_ratio" in preset and crop == "center":
        resize = round(min(size) * preset["resize_ratio"])
    if crop is None:
        crop = "center" if isinstance(resize, int) else "none"
    if isinstance(resize, int) and crop == "none":
        raise DataError(f"--resize {resize} sets the shorter side: it needs --crop center (or give --resize HxW)")
    if isinstance(resize, int) and resize < min(size):
        raise DataError(f"--resize {resize}: smaller than the {size[0]}x{size[1]} crop the model takes")
    if isinstance(resize, tuple) and crop == "center" and (resize[0] < size[0] or resize[1] < size[1]):
        raise DataError(f"--resize {resize[0]}x{resize[1]}: smaller than the {size[0]}x{size[1]} crop the model takes")
    if isinstance(resize, tuple) and crop != "center":
        raise DataError(f"--resize {resize[0]}x{resize[1]} differs from the model's {size[0]}x{size[1]}: add "
                        "--crop center, or resize to the model's size")

    scale = options.scale if options.scale is not None else preset.get("scale")
    mean = options.mean if options.mean is not None else preset.get("mean", (0.0,))
    std = options.std if options.std is not None else preset.get("std", (1.0,))
    channels = 1 if color == "L" else 3
    for name, values in (("--mean", mean), ("--std", std)):
        if len(values) not in (1, channels):
            raise DataError(f"{name} {_numbers(values)}: {len(values)} values for {color}'s {channels} channel(s)")
    if any(s <= 0 for s in std):
        raise DataError(f"--std {_numbers(std)}: every value must be positive")
    return ImagePreprocess(spec.name, (int(size[0]), int(size[1])), resize, crop, letterbox, scale, tuple(mean),
                           tuple(std), layout, color, tuple(notes))


def resolve_audio(options: AudioOptions, spec) -> AudioPreprocess:
    """`options` completed from `spec` (rank 2 [N, T] or 3 [N, C, T] / [N, T, C]); a DataError when
    they contradict the input or leave the window unknown."""
    notes = []
    shape = spec.shape
    if shape is None or len(shape) not in (2, 3):
        raise DataError(f"input {spec.name!r} {spec.describe()} is not an audio input ([N, T], [N, C, T] or "
                        "[N, T, C]): audio cannot feed it")
    if len(shape) == 2:
        layout, t_axis, channels = "NT", 1, 1
    elif shape[1] is not None and shape[1] <= 8 and (shape[2] is None or shape[2] > 8):
        layout, t_axis, channels = "NCT", 2, shape[1]
    elif shape[2] is not None and shape[2] <= 8:
        layout, t_axis, channels = "NTC", 1, shape[2]
    else:
        raise DataError(f"input {spec.name!r} {spec.describe()}: cannot tell its channel axis from its time axis")
    window = options.window
    if window is None:
        window = shape[t_axis]
        if window is None:
            raise DataError(f"input {spec.name!r} {spec.describe()} does not fix its length: give --window SAMPLES "
                            "(e.g. --window 16000 for one second at 16 kHz)")
        notes.append(f"window {window}")
    elif shape[t_axis] is not None and shape[t_axis] != window:
        raise DataError(f"--window {window}: input {spec.name!r} {spec.describe()} takes {shape[t_axis]} samples")
    if window < 1:
        raise DataError(f"--window {window}: must be at least 1")
    hop = options.hop if options.hop is not None else window
    if hop < 1:
        raise DataError(f"--hop {hop}: must be at least 1")
    mono = options.mono
    if mono is None:
        mono = channels == 1
        notes.append("mono" if mono else f"{channels} channels")
    elif mono and channels != 1:
        raise DataError(f"--mono: input {spec.name!r} {spec.describe()} takes {channels} channels")
    if options.sample_rate is not None and options.sample_rate < 1:
        raise DataError(f"--sample-rate {options.sample_rate}: must be at least 1 Hz")
    scale = options.scale
    if scale is None:
        scale = 32768.0 if spec.dtype.kind in "iu" else 1.0
        if spec.dtype.kind in "iu":
            notes.append(f"x*32768 for the {spec.dtype.name} input")
    return AudioPreprocess(spec.name, options.sample_rate, bool(mono), int(channels), int(window), int(hop),
                           float(scale), layout, tuple(notes))


def _image_layout(shape) -> str:
    if len(shape) == 3:
        return "NHW"
    first, last = shape[1], shape[3]
    if last in (1, 3) and first not in (1, 3):
        return "NHWC"
    return "NCHW"


def _number(value: float) -> str:
    inverse = 1 / value if value else 0
    if value < 1 and abs(inverse - round(inverse)) < 1e-9 * inverse:
        return f"1/{round(inverse)}"
    return f"{value:g}"


def _numbers(values) -> str:
    return ",".join(f"{v:g}" for v in values)
