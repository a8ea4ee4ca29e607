"""The one exception family lpt raises for problems a user can fix."""


class LptError(Exception):
    """A problem with the user's input: the CLI prints it as one line and exits non-zero."""


class ModelError(LptError):
    """The model file is missing, unreadable, invalid or unsafe to load."""


class QuantizationError(LptError, ValueError):
    """Quantization parameters that cannot describe a quantized tensor (zero-width range, ...)."""


class DataError(LptError):
    """Sample data that does not fit the model (names, shapes, dtypes, non-finite values)."""
