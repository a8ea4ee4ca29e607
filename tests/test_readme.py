"""README's Python examples run as written (from a folder where models/ is the bundled one)."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def python_blocks():
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_python_examples_run(tmp_path, capsys):
    blocks = python_blocks()
    assert blocks, "README has no Python example"
    (tmp_path / "models").symlink_to(ROOT / "models")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out
    assert "'accuracy'" not in printed and "reference" in printed  # the accuracy dict was printed
    assert (tmp_path / "digits_cnn.int8.onnx").is_file()


def test_readme_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    commands = re.findall(r"```sh\n(.*?)```", text, flags=re.S)[:2]
    assert "lpt quantize models/digits_cnn.onnx" in commands[0]
    assert commands[1].strip() == "pip install -e '.[test]' && pytest"
    assert commands[1].strip() in (ROOT / ".ci" / "run").read_text()
