"""The one exception family lpt raises for problems a user can fix."""


class LptError(Exception):
    """A problem with the user's input: the CLI prints it as one line and exits non-zero."""


class ModelError(LptError):
    """The model file is missing, unreadable, invalid or unsafe to load."""


class QuantizationError(LptError, ValueError):
    """Quantization parameters that cannot describe a quantized tensor (zero-width range, ...)."""


class DataError(LptError):
    """Sample data that does not fit the model (names, shapes, dtypes, non-finite values)."""


class OutputError(LptError, OSError):
    """An output path lpt refuses (an input of the command, a folder, an empty path) or cannot write."""


def shown(text: object) -> str:
    """`text` safe to print: control and other non-printing characters (escape sequences, newlines,
    bidi overrides) as Python escapes ("\\x1b", "\\n", "\\u202e"); printable text, spaces included, as it is.

    Names from a model or a data file reach the terminal only through this, so a file cannot move
    the cursor, recolour the screen or forge a line of lpt's output.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def size_text(n: int) -> str:
    """A byte count for a message: 8.0 GiB, 12.0 MiB, 640 bytes."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
