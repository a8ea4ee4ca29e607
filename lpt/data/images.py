"""One image file → one model sample, as an ImagePreprocess says (Pillow decodes; no decoder of lpt's own).

    sample = load_image(Path("cat.jpg"), preprocess)      # float32 [C, H, W] (NCHW), [H, W, C] or [H, W]

The steps, in torchvision's order: colour conversion, geometry (letterbox, or resize then center
crop, or straight resize; bilinear, skipped when the image already has the size), then in float32
x·scale, (x − mean) / std, and the layout. 16-bit PNGs keep their 16 bits (their default scale is
1/65535): the bundled digits, whose pixels are k/256 for k in 0..256, round-trip exactly through a
16-bit PNG holding k and --scale 1/256.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from lpt.data.preprocess import LETTERBOX_FILL, ImagePreprocess

SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
# The most pixels lpt decodes from one file (Pillow's own bomb limit): a larger header is refused
# before the pixels are read, as a wrongly-sized file.
MAX_PIXELS = 89_478_485


class BadImage(Exception):
    """A file that is not a decodable image of a usable size: the message says why, in one line."""


def load_image(path: Path, preprocess: ImagePreprocess) -> np.ndarray:
    """The sample `path` gives, float32, in preprocess.layout without the batch axis."""
    pixels, depth = _decode(path, preprocess.color)
    pixels = _geometry(pixels, preprocess, depth)
    if preprocess.color == "BGR":
        pixels = pixels[..., ::-1]
    return _normalize(pixels, preprocess, depth)


def _decode(path: Path, color: str) -> tuple[np.ndarray, int]:
    """([H, W, C] in the file's own range: uint8 for 8-bit files, float32 for 16-bit ones; bits per
    channel: 8 or 16)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > MAX_PIXELS:
                    raise BadImage(f"{width}x{height} pixels, more than the {MAX_PIXELS} lpt decodes from one image")
                if width < 1 or height < 1:
                    raise BadImage(f"an empty image ({width}x{height})")
                image.load()  # a truncated or corrupt file fails here, not later
                return _pixels(image, color)
    except BadImage:
        raise
    except Exception as err:  # noqa: BLE001 - Pillow raises what each decoder meets (OSError, SyntaxError, ...)
        text = " ".join(str(err).split()) or type(err).__name__
        raise BadImage(f"not a readable image ({text})") from None


def _pixels(image, color: str) -> tuple[np.ndarray, int]:
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):  # 16-bit grey (PNG): keep every bit
        grey = np.asarray(image, dtype=np.float32)
        if image.mode == "I" and grey.size and grey.max() > 65535:
            raise BadImage("32-bit integer pixels; lpt reads 8- and 16-bit images")
        grey = grey[..., None]
        return (grey if color == "L" else np.repeat(grey, 3, axis=2)), 16
    if image.mode == "F":
        raise BadImage("floating-point pixels; lpt reads 8- and 16-bit images")
    mode = "L" if color == "L" else "RGB"
    array = np.asarray(image.convert(mode), dtype=np.uint8)
    return (array[..., None] if mode == "L" else array), 8


def _geometry(pixels: np.ndarray, preprocess: ImagePreprocess, depth: int) -> np.ndarray:
    """Letterbox, or resize (shorter side, or to cover the crop) then center crop, or resize to the size."""
    height, width = preprocess.size
    h, w = pixels.shape[:2]
    if preprocess.letterbox:
        ratio = min(height / h, width / w)
        new_h, new_w = max(1, round(h * ratio)), max(1, round(w * ratio))
        resized = _resize(pixels, new_h, new_w)
        fill = LETTERBOX_FILL if depth == 8 else LETTERBOX_FILL * 257
        out = np.full((height, width, pixels.shape[2]), fill, pixels.dtype)
        # as YOLO's letterbox: the padding split in two, the odd pixel at the bottom/right
        top, left = round((height - new_h) / 2 - 0.1), round((width - new_w) / 2 - 0.1)
        out[top:top + new_h, left:left + new_w] = resized
        return out
    if isinstance(preprocess.resize, tuple):
        pixels = _resize(pixels, *preprocess.resize)
    elif isinstance(preprocess.resize, int):  # the shorter side, the longer one truncated (torchvision's Resize(N))
        short, long = min(h, w), max(h, w)
        new_short, new_long = preprocess.resize, int(preprocess.resize * long / short)
        new_h, new_w = (new_short, new_long) if h <= w else (new_long, new_short)
        if new_h < height or new_w < width:  # a very wide or tall image: at least cover the crop
            ratio = max(height / h, width / w)
            new_h, new_w = max(height, round(h * ratio)), max(width, round(w * ratio))
        pixels = _resize(pixels, new_h, new_w)
    elif preprocess.crop == "center":  # the smallest size covering the crop, aspect kept
        ratio = max(height / h, width / w)
        pixels = _resize(pixels, max(height, round(h * ratio)), max(width, round(w * ratio)))
    else:
        return _resize(pixels, height, width)
    return _center_crop(pixels, height, width)


def _resize(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of [H, W, C] by Pillow, with its antialiasing when shrinking: 8-bit images in
    their own mode, rounded to 8 bits as torchvision's PIL path does; 16-bit ones channel by channel
    in mode F, so they keep their precision."""
    if pixels.shape[:2] == (height, width):
        return pixels
    from PIL import Image

    if pixels.dtype == np.uint8:
        image = Image.fromarray(np.ascontiguousarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels))
        resized = np.asarray(image.resize((width, height), Image.Resampling.BILINEAR))
        return resized[..., None] if resized.ndim == 2 else resized
    channels = [np.asarray(Image.fromarray(np.ascontiguousarray(pixels[..., c], np.float32))
                           .resize((width, height), Image.Resampling.BILINEAR), dtype=np.float32)
                for c in range(pixels.shape[2])]
    return np.stack(channels, axis=2)


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    h, w = pixels.shape[:2]
    top, left = int(round((h - height) / 2)), int(round((w - width) / 2))
    return pixels[top:top + height, left:left + width]


def _normalize(pixels: np.ndarray, preprocess: ImagePreprocess, depth: int) -> np.ndarray:
    """x·scale, (x − mean) / std in float32, then the layout. A scale 1/d (1/255) divides by d, as
    torchvision's ToTensor does, so the values match its bit for bit."""
    scale = preprocess.scale if preprocess.scale is not None else 1 / (255 if depth == 8 else 65535)
    divisor = 1 / scale
    pixels = pixels.astype(np.float32)
    if abs(divisor - round(divisor)) < 1e-9 * divisor:
        x = pixels / np.float32(round(divisor))
    else:
        x = pixels * np.float32(scale)
    mean = np.asarray(preprocess.mean, np.float32)
    std = np.asarray(preprocess.std, np.float32)
    if mean.any():
        x = x - mean
    if (std != 1).any():
        x = x / std
    x = x.astype(np.float32, copy=False)
    if preprocess.layout == "NCHW":
        return np.ascontiguousarray(x.transpose(2, 0, 1))
    if preprocess.layout == "NHW":
        return np.ascontiguousarray(x[..., 0])
    return np.ascontiguousarray(x)
