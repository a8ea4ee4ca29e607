"""Hostile and broken inputs, through the real CLI: no input is ever modified, no input exhausts the
machine, and every refusal is one line naming what is at fault, with exit code 1 and no output left.

One section per class of issue #14: (1) outputs that name an input, (2) memory and time bombs,
(3) outputs that are not valid ONNX, (4) counts that do not match, (5) errors lpt can check before
the work, (6) terminal injection.
Bombs run in a subprocess limited to 2 GB of address space and 60 s, so a regression fails the
test instead of taking the machine down.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import resource
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from cli.main import main

ROOT = Path(__file__).parent.parent
MODELS = ROOT / "models"
REFUSED = "which this command reads; refusing to overwrite the input, even with --force"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A working folder: fp32 model m.onnx, its QDQ q.onnx, data d.npz (20 samples), a test file
    t.npz (10 samples, 10 labels), e.onnx whose weight lives in w.bin, a data folder samples/."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.onnx").write_bytes((MODELS / "digits_cnn.onnx").read_bytes())
    (tmp_path / "q.onnx").write_bytes((MODELS / "digits_cnn.ort_qdq.onnx").read_bytes())
    with np.load(MODELS / "digits_cnn.test.npz") as test:
        x, labels = test["input"][:20], test["labels"][:20]
    np.savez(tmp_path / "d.npz", input=x)
    np.savez(tmp_path / "t.npz", input=x[:10], labels=labels[:10])
    (tmp_path / "samples").mkdir()
    np.savez(tmp_path / "samples" / "a.npz", input=x[:8])
    np.savez(tmp_path / "samples" / "b.npz", input=x[8:])
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    external_model(tmp_path / "e.onnx", "w.bin")
    return tmp_path


def matmul_model() -> onnx.ModelProto:
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(w, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    return proto


def external_model(path: Path, location: str, *, length: int | None = None, dims=None) -> Path:
    """matmul_model with its weight `w` in external data at `location` (a declared length and dims if given)."""
    proto = matmul_model()
    tensor = proto.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    if length is not None:
        tensor.external_data.add(key="length", value=str(length))
    if dims is not None:
        del tensor.dims[:]
        tensor.dims.extend(dims)
    path.write_bytes(proto.SerializeToString())
    return path


def graph_model(path: Path, nodes, initializers=(), *, x=(1, 4), x_type=TensorProto.FLOAT, y_shape=(1, 4)) -> Path:
    """A model of `nodes` from input x (float [1, 4] by default) to output y, with x.npz beside it (3 samples)."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x_type, list(x))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))], list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    path.write_bytes(proto.SerializeToString())
    np.savez(path.with_suffix(".npz"), x=np.ones((3, *x[1:]), helper.tensor_dtype_to_np_dtype(x_type)))
    return path


def int64s(name: str, values) -> TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under `root`: a file's sha256 (size and mtime for a large sparse one), a link's target."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = ("link", os.readlink(path))
        elif path.is_file():
            info = path.stat()
            found[name] = ((info.st_size, info.st_mtime_ns) if info.st_size > 64 << 20
                           else hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            found[name] = "folder" if path.is_dir() else "special"
    return found


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def error_line(result) -> str:
    """The one line the CLI printed for a refusal (and nothing else: no traceback, no fallback)."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "rerun with --debug" not in lines[0]
    return lines[0][len("error: "):]


def refused(folder: Path, *args) -> str:
    """Run a command that must be refused: its message, after checking nothing under `folder` changed."""
    before = snapshot(folder)
    message = error_line(invoke(*args))
    assert snapshot(folder) == before  # inputs untouched, no output or temp file left behind
    return message


def limited(*args, cwd: Path, preexec=None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in a subprocess with at most 2 GB of address space (a bomb fails, not the machine)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        if preexec is not None:
            preexec()

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], cwd=cwd, env=env, preexec_fn=limit,
                          capture_output=True, text=True, timeout=timeout)


def limited_refusal(folder: Path, *args, **kwargs) -> str:
    before = snapshot(folder)
    run = limited(*args, cwd=folder, **kwargs)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), (run.returncode, run.stderr)
    assert "rerun with --debug" not in lines[0]
    assert snapshot(folder) == before
    return lines[0][len("error: "):]


# -- 1. an output that names an input is refused, with or without --force, however it is spelled


def test_the_data_is_never_an_output(folder):
    assert refused(folder, "calibrate", "m.onnx", "--data", "d.npz", "-o", "d.npz", "--force") == (
        f"-o d.npz: is the data, {REFUSED}")
    assert refused(folder, "calibrate", "m.onnx", "--data", "d.npz", "-o", "samples/../d.npz", "--force") == (
        f"-o samples/../d.npz: is the data (d.npz), {REFUSED}")
    assert refused(folder, "run", "q.onnx", "--data", folder / "d.npz", "-o", "d.npz", "--force") == (
        f"-o d.npz: is the data ({folder / 'd.npz'}), {REFUSED}")


def test_a_symlink_or_a_hard_link_to_an_input_is_that_input(folder):
    (folder / "link.npz").symlink_to("d.npz")
    assert refused(folder, "run", "q.onnx", "--data", "d.npz", "-o", "link.npz", "--force") == (
        f"-o link.npz: is the data (d.npz), {REFUSED}")
    os.link(folder / "d.npz", folder / "out.fq.onnx")  # what `quantize -o out` would write first
    assert refused(folder, "quantize", "m.onnx", "--data", "d.npz", "-o", "out", "--force") == (
        f"-o out.fq.onnx: is the data (d.npz), {REFUSED}")


@pytest.mark.parametrize("args, message", [
    pytest.param(["compare", "m.onnx", "q.onnx", "--data", "t.npz", "--json", "q.onnx", "--force"],
                 f"--json q.onnx: is the candidate model, {REFUSED}", id="compare-json-candidate"),
    pytest.param(["compare", "m.onnx", "q.onnx", "--data", "t.npz", "--labels", "labels", "--plot", "./t.npz",
                  "--force"], f"--plot t.npz: is the data, {REFUSED}", id="compare-plot-labels"),
    pytest.param(["quantize", "m.onnx", "--data", "d.npz", "--json", "./m.onnx", "--force"],
                 f"--json m.onnx: is the model, {REFUSED}", id="quantize-json-model"),
    pytest.param(["normalize", "q.onnx", "-o", "samples/../q.onnx", "--force"],
                 f"-o samples/../q.onnx: is the model (q.onnx), {REFUSED}", id="normalize-spelling"),
    pytest.param(["bench", "q.onnx", "--data", "d.npz", "--fp32", "m.onnx", "--json"], None, id="bench-reads-only"),
])
def test_no_command_writes_over_a_model_or_its_data(folder, args, message):
    if message is None:  # bench writes nothing: it must still leave every input as it was
        before = snapshot(folder)
        assert invoke(*args, "--repeats", 1, "--threads", 1).exit_code == 0
        assert snapshot(folder) == before
        return
    assert refused(folder, *args) == message


def test_external_data_is_an_input_too(folder):
    assert refused(folder, "transform", "e.onnx", "-o", "w.bin", "--force") == (
        f"-o w.bin: is external data of the model e.onnx ({folder / 'w.bin'}), {REFUSED}")
    (folder / "weights.link").symlink_to("w.bin")
    assert refused(folder, "export", "e.onnx", "-o", "weights.link", "--force") == (
        f"-o weights.link: is external data of the model e.onnx ({folder / 'w.bin'}), {REFUSED}")


def test_a_data_folder_keeps_its_files(folder):
    assert refused(folder, "run", "q.onnx", "--data", "samples", "-o", "samples/a.npz", "--force") == (
        f"-o samples/a.npz: is a file of the data samples, {REFUSED}")
    assert refused(folder, "run", "q.onnx", "--data", "samples", "-o", "samples/outputs.npz") == (
        "-o samples/outputs.npz: would be read as data next time, from the data folder samples; write it elsewhere")


def test_two_outputs_cannot_be_one_file(folder):
    assert refused(folder, "compare", "m.onnx", "q.onnx", "--data", "t.npz", "--json", "r.json",
                   "--plot", "./r.json") == "--plot r.json: is also the output of --json"


def test_the_last_check_at_write_time_covers_files_read_but_not_declared(folder):
    import lpt
    from lpt import paths

    with paths.watching():
        lpt.load(folder / "e.onnx")  # reads w.bin; nothing declared it
        with pytest.raises(lpt.errors.OutputError, match=f"output {folder / 'w.bin'}: is external data"):
            lpt.model_io.write_bytes(b"gone", folder / "w.bin", overwrite=True)
    assert (folder / "w.bin").read_bytes() == np.arange(16, dtype=np.float32).tobytes()


# -- 2. memory and time bombs are refused before anything is allocated or blocks


def test_a_huge_or_implausible_model_file_is_refused_before_it_is_read(folder):
    with open(folder / "big.onnx", "wb") as f:
        f.truncate(8 << 30)  # sparse: no disk used
    assert limited_refusal(folder, "inspect", "big.onnx") == (
        "big.onnx: 8.0 GiB, more than the 2 GiB an ONNX file can hold (protobuf's limit); a larger model keeps "
        "its weights in external data files")
    with open(folder / "zeros.onnx", "wb") as f:
        f.truncate(1 << 30)
    assert refused(folder, "inspect", "zeros.onnx") == (
        "zeros.onnx: not an ONNX model (its first bytes cannot start one)")
    whole = matmul_model().SerializeToString()
    (folder / "cut.onnx").write_bytes(whole[: len(whole) // 2])
    assert refused(folder, "inspect", "cut.onnx").startswith(
        "cut.onnx: not an ONNX model, or a truncated one (the graph at byte")


def test_external_data_must_be_what_the_tensor_takes(folder):
    with open(folder / "sparse.bin", "wb") as f:
        f.truncate(8 << 30)
    external_model(folder / "long.onnx", "w.bin", length=8 << 30)  # onnx too refuses a length past the end
    assert refused(folder, "inspect", "long.onnx") == (
        "long.onnx: tensor 'w' declares 8589934592 bytes of external data, but its dims [4, 4] take 64")
    external_model(folder / "wide.onnx", "sparse.bin", dims=[1 << 20, 1 << 20])
    assert limited_refusal(folder, "inspect", "wide.onnx") == (
        "wide.onnx: tensor 'w' takes 4.0 TiB from byte 0 of 'sparse.bin', which holds 8.0 GiB")
    external_model(folder / "unbounded.onnx", "sparse.bin")  # no length: only the 64 bytes [4, 4] take are read
    run = limited("inspect", "unbounded.onnx", "--json", cwd=folder)
    assert run.returncode == 0, run.stderr


def npz_with_a_lying_header(path: Path, key: str, shape: tuple[int, ...], extra: dict | None = None) -> Path:
    """An .npz whose member `key` declares `shape` of float64 but holds 16 bytes (a few bytes claiming gigabytes)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{key}.npy", header.getvalue() + bytes(16))
        for name, array in (extra or {}).items():
            buffer = io.BytesIO()
            np.save(buffer, array)
            archive.writestr(f"{name}.npy", buffer.getvalue())
    return path


def test_npz_headers_are_checked_before_any_member_is_read(folder):
    npz_with_a_lying_header(folder / "inputs.npz", "input", (1 << 31,))  # streamed: never a bomb, now named earlier
    assert refused(folder, "run", "q.onnx", "--data", "inputs.npz") == (
        "inputs.npz[input]: its header declares float64 [2147483648] (16.0 GiB), but the member holds 16 bytes")
    # labels beside the inputs: once read whole with every input, now only after their header
    x = np.load(folder / "d.npz")["input"][:10]
    npz_with_a_lying_header(folder / "labelled.npz", "labels", (1 << 31,), {"input": x})
    assert limited_refusal(folder, "compare", "m.onnx", "q.onnx", "--data", "labelled.npz", "--labels", "labels") == (
        "labelled.npz[labels]: its header declares float64 [2147483648] (16.0 GiB), but the member holds 16 bytes")


def test_a_fifo_is_refused_instead_of_blocking_forever(folder):
    os.mkfifo(folder / "pipe.npz")
    os.mkfifo(folder / "pipe.onnx")
    assert limited_refusal(folder, "run", "q.onnx", "--data", "pipe.npz", timeout=60) == (
        "pipe.npz: not a regular file (a FIFO); give a .npz, a .npy or a folder")
    assert limited_refusal(folder, "inspect", "pipe.onnx", timeout=60) == (
        "pipe.onnx: not a regular file (a FIFO); lpt reads models from files")


def test_thread_counts_are_capped_by_the_machine(folder):
    run = limited("run", "q.onnx", "--data", "d.npz", "--threads", 100000, cwd=folder)
    assert run.returncode == 0, run.stderr  # was SIGSEGV
    cores = len(os.sched_getaffinity(0))
    assert run.stderr.strip() == (f"warning: --threads 100000 is more than the {cores} cores this machine gives lpt; "
                                  f"using {cores}")
    assert run.stdout.startswith("20 samples")


def bomb(op: str) -> list:
    """The nodes and constants of a shape bomb: `op` makes 'big' (float, 100000 × 100000 elements, 37.3 GiB
    from 16 bytes of shape), reduced to y [1, 4]."""
    shape = int64s("s", [100000, 100000])
    make = {"ConstantOfShape": helper.make_node("ConstantOfShape", ["s"], ["big"], name="bomb",
                                                value=numpy_helper.from_array(np.ones(1, np.float32))),
            "Expand": helper.make_node("Expand", ["x", "s"], ["big"], name="bomb"),
            "Tile": helper.make_node("Tile", ["x", "s"], ["big"], name="bomb")}[op]
    if op == "Expand":
        shape = int64s("s", [100000, 1, 100000])
    return [make, helper.make_node("ReduceMax", ["big"], ["r"], name="max", keepdims=0),
            helper.make_node("Add", ["x", "r"], ["y"], name="add")], [shape]


def default_budget() -> str:
    from lpt import limits
    from lpt.errors import size_text

    return size_text(limits.default_max_memory())


@pytest.mark.parametrize("op, shape", [
    pytest.param("ConstantOfShape", "[100000, 100000]", id="constant-of-shape"),
    pytest.param("Expand", "[100000, 1, 100000]", id="expand"),
    pytest.param("Tile", "[100000, 400000]", id="tile"),
])
def test_shape_constants_asking_for_gigabytes_are_refused_at_load(folder, op, shape):
    nodes, constants = bomb(op)
    graph_model(folder / "bomb.onnx", nodes, constants, x=(1, 1) if op == "Expand" else (1, 4))
    size = "149.0 GiB" if op == "Tile" else "37.3 GiB"
    assert limited_refusal(folder, "run", "bomb.onnx", "--data", "bomb.npz") == (
        f"bomb.onnx: node 'bomb' ({op}) makes 'big', float32 {shape}: {size}, more than the memory budget of "
        f"{default_budget()} (--max-memory raises it)")


def test_max_memory_raises_the_budget_and_onnxruntime_failing_to_allocate_is_one_line(folder):
    constant = helper.make_node("ConstantOfShape", ["s"], ["big"], name="bomb",
                                value=numpy_helper.from_array(np.ones(1, np.float32)))
    graph_model(folder / "bomb.onnx", [constant, helper.make_node("ReduceMax", ["big"], ["r"], name="max", keepdims=0),
                                       helper.make_node("Add", ["x", "r"], ["y"], name="add")],
                [int64s("s", [3 << 28])])  # 3 GiB
    assert limited_refusal(folder, "run", "bomb.onnx", "--data", "bomb.npz") == (
        f"bomb.onnx: node 'bomb' (ConstantOfShape) makes 'big', float32 [805306368]: 3.0 GiB, more than the memory "
        f"budget of {default_budget()} (--max-memory raises it)")
    # past the budget, the 2 GB address-space limit stands for a machine without the memory
    assert limited_refusal(folder, "run", "bomb.onnx", "--data", "bomb.npz", "--max-memory", "4GB") == (
        "node 'bomb' (ConstantOfShape): onnxruntime could not allocate 3.0 GiB for it")
    assert refused(folder, "run", "bomb.onnx", "--max-memory", "4 gigs") == (
        "--max-memory '4 gigs': not a size; give bytes or a number with KB, MB, GB or TB (e.g. 4GB)")


def test_a_graph_of_100k_nodes_is_refused_in_seconds(folder):
    nodes = [helper.make_node("Identity", [f"v{i}" if i else "x"], [f"v{i + 1}" if i < 99_999 else "y"],
                              name=f"n{i}") for i in range(100_000)]
    graph_model(folder / "long.onnx", nodes)
    start = time.perf_counter()
    assert limited_refusal(folder, "run", "long.onnx", "--data", "long.npz") == (
        f"long.onnx: 100000 nodes; lpt holds about 32 KiB per node as it works (3.1 GiB), more than the memory "
        f"budget of {default_budget()} (--max-memory raises it)")
    assert time.perf_counter() - start < 20  # running it took 45 s and 1.1 GB


def test_ten_thousand_subgraphs_are_refused_before_shape_inference(folder):
    """onnx's shape inference is quadratic in subgraphs: 40k took 80 s before lpt looked at anything."""
    def branch(name: str, i: int) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Identity", ["x"], [f"{name}{i}"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}{i}", TensorProto.FLOAT, [1, 4])])

    ifs = [helper.make_node("If", ["c"], [f"v{i}"], name=f"if{i}", then_branch=branch("then", i),
                            else_branch=branch("else", i)) for i in range(5001)]
    condition = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "s"], ["c"])]
    graph_model(folder / "ifs.onnx", [*condition, *ifs, helper.make_node("Identity", ["v0"], ["y"])])
    assert refused(folder, "inspect", "ifs.onnx") == (
        "ifs.onnx: 10002 subgraphs (If, Loop and Scan bodies), more than the 10000 lpt takes: the time to infer "
        "their shapes grows with their square")


def test_a_region_onnxruntime_refuses_is_split_in_halves_not_into_one_session_per_node(folder, monkeypatch):
    """onnxruntime has no Erf for doubles: only Erf runs alone (ONNX's reference evaluator), every
    other node in a session of many; one session per node (each with its own threads) exhausted
    the machine on a 100k-node graph."""
    import lpt
    from lpt.backend import fallback

    adds = 256
    nodes = [helper.make_node("Cast", ["x"], ["d0"], to=TensorProto.DOUBLE, name="to_double")]
    for i in range(2 * adds):
        nodes.append(helper.make_node("Add", [f"d{i}", "c"], [f"d{i + 1}"], name=f"add{i}"))
        if i == adds - 1:
            nodes.append(helper.make_node("Erf", [f"d{i + 1}"], ["e"], name="erf"))
            nodes[-2].output[0] = "a"
            nodes[-1].input[0] = "a"
            nodes[-1].output[0] = f"d{i + 1}"
    nodes.append(helper.make_node("Cast", [f"d{2 * adds}"], ["y"], to=TensorProto.FLOAT, name="to_float"))
    graph_model(folder / "erf.onnx", nodes, [numpy_helper.from_array(np.full(4, 1e-3), "c")])
    sessions = []
    session = fallback._session
    monkeypatch.setattr(fallback, "_session", lambda *args: sessions.append(1) or session(*args))
    result = lpt.run(folder / "erf.onnx", folder / "erf.npz")
    expected = np.float32(math.erf(1 + adds * 1e-3) + adds * 1e-3)
    np.testing.assert_allclose(result.outputs["y"], np.full((3, 4), expected), rtol=1e-6)
    assert len(nodes) == 2 * adds + 3 and len(sessions) <= 2 * math.ceil(math.log2(len(nodes))) + 1


def test_fallback_sessions_take_at_most_one_thread_per_core(folder):
    from lpt import limits
    from lpt.backend import fallback

    session = fallback._session(matmul_model(), 100_000, alone=False)
    assert session.get_session_options().intra_op_num_threads == limits.cores()


# -- 3. every model lpt writes passes onnx.checker with full shape inference, or nothing is written


def test_a_conv_whose_weight_has_the_wrong_rank_is_refused_at_load(folder):
    """onnx's shape inference trusts kernel_shape and onnxruntime fails only when the Conv runs, so
    transform and export, which run nothing, wrote the model as it was."""
    proto = onnx.load(folder / "m.onnx")
    weight = next(t for t in proto.graph.initializer if t.name == "conv1.weight")
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight).reshape(8, 1, 9), "conv1.weight"))
    (folder / "bad.onnx").write_bytes(proto.SerializeToString())
    message = ("bad.onnx: node '/conv1/Conv' (Conv): weight 'conv1.weight' is [8, 1, 9] (rank 3), but input 'input' "
               "has rank 4; the weight has its input's rank")
    for args in (["transform", "bad.onnx", "-o", "out.onnx"], ["export", "bad.onnx", "-o", "out.onnx"],
                 ["calibrate", "bad.onnx", "--data", "d.npz", "-o", "out.onnx"]):
        assert refused(folder, *args) == message


def test_a_model_that_fails_the_checker_is_not_written(folder):
    """A Transpose whose perm does not fit its input: onnx.checker's plain check passes it, full shape
    inference does not."""
    graph_model(folder / "perm.onnx", [helper.make_node("Transpose", ["x"], ["t"], name="bad", perm=[1, 0, 2]),
                                       helper.make_node("Relu", ["t"], ["y"], name="relu")])
    why = ("[ShapeInferenceError] Inference error(s): (op_type:Transpose, node name: bad): [TypeInferenceError] "
           "Invalid attribute perm {1, 0, 2}, input shape = {1, 4}")
    for command in ("normalize", "export"):
        assert refused(folder, command, "perm.onnx", "-o", "out.onnx") == (
            f"out.onnx: not written, the model fails onnx.checker: {why}")


def test_two_models_are_both_written_or_neither(folder):
    import lpt

    valid, invalid = matmul_model(), matmul_model()
    invalid.graph.node[0].op_type = "Conv"  # a [4, 4] weight for a [1, 4] input
    with pytest.raises(lpt.ModelError, match=r"^b.onnx: not written, the model fails onnx.checker: "):
        lpt.model_io.write_models([(valid, "a.onnx"), (invalid, "b.onnx")])
    assert not (folder / "a.onnx").exists() and not (folder / "b.onnx").exists()


def test_shape_hints_that_contradict_the_inference_are_dropped_not_refused(folder):
    import lpt

    proto = matmul_model()
    proto.graph.value_info.append(helper.make_tensor_value_info("stale", TensorProto.FLOAT, [7]))
    proto.graph.node.append(helper.make_node("Identity", ["y"], ["stale"], name="copy"))
    lpt.model_io.write_model(proto, "hinted.onnx")
    written = onnx.load(folder / "hinted.onnx")
    assert not written.graph.value_info and [n.name for n in written.graph.node] == ["mm", "copy"]


# -- 4. counts that do not match are errors that say both numbers


def test_labels_are_one_per_sample(folder):
    with np.load(folder / "t.npz") as test:
        x, labels = test["input"], test["labels"]
    np.savez(folder / "more.npz", input=x, labels=np.concatenate([labels, labels[:2]]))
    assert refused(folder, "compare", "m.onnx", "q.onnx", "--data", "more.npz", "--labels", "labels") == (
        "more.npz: 12 labels under key 'labels', but input 'input' holds 10 samples; give one label per sample")
    np.savez(folder / "fewer.npz", input=x, labels=labels[:7])
    assert refused(folder, "compare", "m.onnx", "q.onnx", "--data", "fewer.npz", "--labels", "labels") == (
        "fewer.npz: 7 labels under key 'labels', but input 'input' holds 10 samples; give one label per sample")


@pytest.mark.parametrize("args, message", [
    pytest.param(["run", "q.onnx", "--data", "d.npz", "--batch-size", -3], "--batch-size -3: must be at least 1",
                 id="run-negative-batch"),
    pytest.param(["run", "q.onnx", "--data", "d.npz", "--batch-size", 0], "--batch-size 0: must be at least 1",
                 id="run-zero-batch"),
    pytest.param(["run", "q.onnx", "--data", "d.npz", "--threads", -1], "--threads -1: must be at least 0",
                 id="run-negative-threads"),
    pytest.param(["bench", "q.onnx", "--data", "d.npz", "--repeats", 0], "--repeats 0: must be at least 1",
                 id="bench-zero-repeats"),
    pytest.param(["quantize", "m.onnx", "--data", "d.npz", "--subset-size", 0], "--subset-size 0: must be at least 1",
                 id="quantize-zero-subset"),
    pytest.param(["calibrate", "m.onnx", "--data", "d.npz", "--subset-size", -5],
                 "--subset-size -5: must be at least 1", id="calibrate-negative-subset"),
])
def test_sizes_and_counts_below_one_name_their_option(folder, args, message):
    assert refused(folder, *args) == message


# -- 5. what lpt can check, it checks before the work, and says in one line


def test_a_corrupt_npz_member_names_the_file_and_the_key(folder):
    x = np.random.default_rng(0).uniform(size=(20, 1, 16, 16)).astype(np.float32)
    np.savez_compressed(folder / "c.npz", input=x)
    damaged = bytearray((folder / "c.npz").read_bytes())
    damaged[200:210] = b"\xff" * 10  # inside the deflated data
    (folder / "c.npz").write_bytes(bytes(damaged))
    assert refused(folder, "run", "q.onnx", "--data", "c.npz").startswith("c.npz[input]: ")


def test_outputs_are_checked_before_the_work(folder):
    assert refused(folder, "transform", "q.onnx", "-o", "") == "-o: the output path is empty"
    assert refused(folder, "quantize", "m.onnx", "--data", "d.npz", "-o", "") == "-o: the output prefix is empty"
    assert refused(folder, "calibrate", "m.onnx", "--data", "d.npz", "-o", "samples") == (
        "-o samples: is a folder; give a file path")
    assert refused(folder, "export", "q.onnx", "-o", "nowhere/q.onnx") == "-o nowhere/q.onnx: no such folder nowhere"
    assert refused(folder, "quantize", "m.onnx", "--data", "d.npz", "--json", "samples") == (
        "--json samples: is a folder; give a file path")


def test_a_node_onnxruntime_fails_to_run_is_named_in_one_line(folder):
    nodes, constants = bomb("Tile")
    graph_model(folder / "bomb.onnx", nodes, constants)
    assert limited_refusal(folder, "run", "bomb.onnx", "--data", "bomb.npz", "--max-memory", "1TB") == (
        "node 'bomb' (Tile): onnxruntime failed: Tile output tensor would require more than 4294967296 bytes, which "
        "exceeds the supported maximum of 4294967296 bytes.")


def test_a_name_at_the_file_systems_limit_is_written(folder):
    longest = "n" * (os.pathconf(folder, "PC_NAME_MAX") - len(".onnx")) + ".onnx"
    result = invoke("transform", "q.onnx", "-o", longest, "--quiet")
    assert result.exit_code == 0, result.output  # the temp file's name (.lpt-XXXXXXXX.tmp) is short
    assert onnx.load(folder / longest).graph.node
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert refused(folder, "transform", "q.onnx", "-o", "n" + longest) == (
        f"-o n{longest}: the file name is {len(longest) + 1} bytes, more than the {len(longest)} its file system takes")


def test_a_failed_write_names_the_file_and_the_cause(folder):
    """A file size limit stands for a full disk: the write fails midway, nothing is left behind."""

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    assert limited_refusal(folder, "transform", "q.onnx", "-o", "out.onnx", preexec=small_files) == (
        "out.onnx: cannot write (File too large)")


# -- 6. names from files never reach the terminal raw


ESCAPE = "evil\x1b]0;owned\x07\x1b[2J\nline"


def test_inspect_and_transform_print_names_escaped(folder):
    proto = onnx.load(folder / "q.onnx")
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    conv.name = ESCAPE
    (folder / "evil.onnx").write_bytes(proto.SerializeToString())
    fp32 = onnx.load(folder / "m.onnx")
    next(n for n in fp32.graph.node if n.op_type == "Conv").name = ESCAPE
    (folder / "evil_fp32.onnx").write_bytes(fp32.SerializeToString())
    for args in (["transform", "evil.onnx", "-o", "int8.onnx"], ["inspect", "evil_fp32.onnx"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output and "\x07" not in result.output
        assert r"evil\x1b]0;owned\x07" in result.output  # in the node column (the table may cut it after)
    assert r"│ evil\x1b]0;owned\x07\x1b[2J\nline │ Conv │" in result.output  # inspect's table of unquantized ops


def test_error_messages_escape_names_from_files(folder):
    np.savez(folder / "keys.npz", **{ESCAPE: np.zeros((2, 1, 16, 16), np.float32)})
    assert refused(folder, "run", "q.onnx", "--data", "keys.npz") == (
        r"keys.npz: key(s) evil\x1b]0;owned\x07\x1b[2J line match no model input; the model expects inputs: input")
