"""The options that say how a folder of images or audio becomes samples: one decorator for every
command that reads data (calibrate, quantize, compare, run).

    @main.command()
    ...
    @_one_line_errors
    @data_options                    # below _one_line_errors: a bad value is a one-line error
    def run(..., data_options: DataOptions, files): ...

The command gets them as one `data_options` (values parsed, nothing checked against a model yet)
and calls `open_folder`, which asks the library (lpt.data.open_data) and prints what was chosen.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import click

from cli.shared import say
from lpt.data import PRESETS, AudioOptions, FolderSource, ImageOptions, open_data
from lpt.data.preprocess import COLORS, CROPS, LAYOUTS, parse_number, parse_numbers, parse_size


@dataclass(frozen=True)
class DataOptions:
    image: ImageOptions
    audio: AudioOptions
    skip_bad: bool


_OPTIONS = [
    click.option("--preprocess", "preprocess", type=click.Choice(list(PRESETS)),
                 help="Image preprocessing preset for a folder of images: imagenet (shorter side to 256/224 of the "
                      "crop, center crop, RGB, x/255, ImageNet mean/std), yolo (letterbox, RGB, x/255), minus1to1 "
                      "((x/255-0.5)/0.5), unit (x/255), raw (0..255). Options given override it. "
                      "E.g. --data photos/ --preprocess imagenet"),
    click.option("--resize", metavar="N|HxW", help="Images: resize the shorter side to N (then --crop center), or to "
                 "HxW. Default: straight to the model's size. E.g. --resize 256, or --resize 48x320 for an input "
                 "whose width is not fixed"),
    click.option("--crop", type=click.Choice(CROPS), help="Images: center-crop to the model's size after resizing "
                 "(aspect kept), or none. E.g. --resize 256 --crop center"),
    click.option("--letterbox/--no-letterbox", default=None, help="Images: scale to fit the model's size, aspect "
                 "kept, and pad with grey 114, as YOLO does. E.g. --letterbox"),
    click.option("--mean", metavar="M|M,M,M", help="Images: subtract after scaling, one value or one per channel. "
                 "E.g. --mean 0.485,0.456,0.406"),
    click.option("--std", metavar="S|S,S,S", help="Images: divide by after subtracting the mean. "
                 "E.g. --std 0.229,0.224,0.225"),
    click.option("--scale", metavar="X", help="Multiply the decoded values first: image pixels (0..255; default 1/255, "
                 "1/65535 for 16-bit files) or audio samples ([-1,1]; default 1, 32768 for int16 inputs). "
                 "E.g. --scale 1/255, or --scale 32768 for the int16 range"),
    click.option("--layout", type=click.Choice(LAYOUTS), help="Images: the input's layout (NHW: grey, no channel "
                 "axis). Default: from the input's shape. E.g. --layout NHWC"),
    click.option("--color", type=click.Choice(COLORS), help="Images: channel order, or L for grey. Default: L for "
                 "one channel, RGB for three. E.g. --color BGR"),
    click.option("--sample-rate", type=int, metavar="HZ", help="Audio: resample every file to HZ (soxr). Default: "
                 "the first file's rate. E.g. --sample-rate 16000"),
    click.option("--mono/--no-mono", default=None, help="Audio: average the channels. Default: when the model "
                 "takes one channel. E.g. --mono"),
    click.option("--window", type=int, metavar="SAMPLES", help="Audio: samples per model input. Default: the "
                 "input's time dim. E.g. --window 16000 (one second at 16 kHz)"),
    click.option("--hop", type=int, metavar="SAMPLES", help="Audio: samples between window starts. Default: the "
                 "window (no overlap). E.g. --hop 8000"),
    click.option("--skip-bad", is_flag=True, help="Skip files that cannot be decoded (unreadable, truncated, wrongly "
                 "sized) and count them, instead of stopping at the first. E.g. --data photos/ --skip-bad"),
]
_NAMES = ("preprocess", "resize", "crop", "letterbox", "mean", "std", "scale", "layout", "color", "sample_rate", "mono",
          "window", "hop", "skip_bad")


def data_options(command):
    """The options above, given to `command` as one `data_options` (a DataOptions). Put it below
    _one_line_errors, so that a value that does not parse is a one-line error."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        values = {name: kwargs.pop(name) for name in _NAMES}
        return command(*args, data_options=parse(values), **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def parse(values: dict) -> DataOptions:
    """The raw option values as DataOptions (a bad value: a one-line DataError naming the option)."""
    scale = None if values["scale"] is None else parse_number(values["scale"], "--scale")
    image = ImageOptions(
        preset=values["preprocess"],
        resize=None if values["resize"] is None else parse_size(values["resize"]),
        crop=values["crop"], letterbox=values["letterbox"],
        mean=None if values["mean"] is None else parse_numbers(values["mean"], "--mean"),
        std=None if values["std"] is None else parse_numbers(values["std"], "--std", positive=True),
        scale=scale, layout=values["layout"], color=values["color"])
    audio = AudioOptions(sample_rate=values["sample_rate"], mono=values["mono"], window=values["window"],
                         hop=values["hop"], scale=scale)
    return DataOptions(image, audio, bool(values["skip_bad"]))


def open_folder(data, model, options: DataOptions, *, labels=None, batch_axes=None, quiet: bool = False):
    """`data` as the library reads it (lpt.data.open_data): a folder of images or audio becomes a source
    whose files, labels and preprocessing (and where it came from) are printed in one line."""
    csv = labels if labels is not None and str(labels).lower().endswith(".csv") else None
    source = open_data(data, model, image=options.image, audio=options.audio, labels=csv,
                       skip_bad=options.skip_bad, batch_axes=batch_axes)
    if isinstance(source, FolderSource):
        if not quiet:
            say(source.describe())
    elif options.skip_bad:
        say("--skip-bad: applies to folders of images or audio; ignored for this data")
    return source


def say_skipped(source) -> None:
    """With --skip-bad: how many files were skipped, and the first with why."""
    if isinstance(source, FolderSource) and source.skipped:
        path, why = next(iter(source.skipped.items()))
        say(f"skipped {len(source.skipped)} unreadable file{'s' if len(source.skipped) > 1 else ''} "
            f"(first: {path}: {why})")
