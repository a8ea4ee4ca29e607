"""The user's own data: folders of images or audio (with labels), lpt.Dataset and onnxruntime readers.

    source = lpt.data.open_data("photos/", "model.onnx", image=ImageOptions(preset="imagenet"))
    print(source.describe())
    lpt.quantize("model.onnx", source)

    lpt.quantize(model, lpt.Dataset(torch_dataset, lambda item: {"input": item[0].numpy()}))

Modules: preprocess (options, presets, resolution against the model's input, the JSON recorded in
the FQ model), images and audio (one file → samples), labels (which files, which labels), sources
(the DataSource classes CalibrationData reads, and open_data).
"""

from lpt.data.preprocess import (
    METADATA_KEY,
    PRESETS,
    AudioOptions,
    AudioPreprocess,
    ImageOptions,
    ImagePreprocess,
)
from lpt.data.sources import DataSource, Dataset, FolderSource, ReaderSource, open_data, record_preprocess

__all__ = [
    "METADATA_KEY", "PRESETS", "AudioOptions", "AudioPreprocess", "DataSource", "Dataset", "FolderSource",
    "ImageOptions", "ImagePreprocess", "ReaderSource", "open_data", "record_preprocess",
]
