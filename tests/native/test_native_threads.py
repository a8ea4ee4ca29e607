"""The engine's thread pool (lpt/native/parallel.cpp) gives the one-thread result however its loops
are shared: with two threads, from several Python threads at once (all but one run their loops
alone), and in a child process forked after the pool started its workers (which the child has not)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import lpt.native
from lpt.native.program import Program


def conv_and_input(threads: int):
    """A 3×3 32→32 convolution on 48×48 (2.1M products, well past the size that takes a second thread)
    and an input for it."""
    rng = np.random.default_rng(7)
    weights = rng.integers(-128, 128, (32, 32, 3, 3)).astype(np.int8)
    conv = lpt.native.Conv(weights, src_zero_point=128, multiplier=np.float32(0.002), pads=(1, 1, 1, 1),
                           threads=threads)
    return conv, rng.integers(0, 256, (1, 32, 48, 48)).astype(np.uint8)


def one_thread_result():
    conv, q = conv_and_input(threads=1)
    return conv(q)


def test_two_threads_give_the_one_thread_result():
    expected = one_thread_result()
    conv, q = conv_and_input(threads=2)
    for _ in range(5):  # the chunks land on different threads from run to run
        np.testing.assert_array_equal(conv(q), expected)


def test_callers_from_several_python_threads_at_once():
    expected = one_thread_result()
    conv, q = conv_and_input(threads=2)
    with ThreadPoolExecutor(4) as executor:
        results = list(executor.map(lambda _: conv(q), range(16)))
    for result in results:
        np.testing.assert_array_equal(result, expected)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_runs_loops_on_workers_of_its_own():
    """On a Softmax: a loop of lpt's on every route. (A convolution on oneDNN's routes runs on
    libgomp's threads, and libgomp's pool hangs in a child forked after it started: not lpt's.)"""
    x = np.random.default_rng(3).normal(0, 4, (512, 256)).astype(np.float32)
    [expected] = Program([("softmax", ["x"], "s", None)], ["x"], ["s"], threads=1)(x)
    softmax = Program([("softmax", ["x"], "s", None)], ["x"], ["s"], threads=2)
    softmax(x)  # the parent's pool has its workers now
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its result down the pipe, then out without running pytest's exit hooks
        try:
            os.write(write, softmax(x)[0].tobytes())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    np.testing.assert_array_equal(np.frombuffer(b"".join(chunks), np.float32).reshape(x.shape), expected)


def test_a_plan_holds_the_workers_while_it_runs_and_lets_go_after_a_failure(tmp_path):
    """A plan's run keeps the engine's workers awake between its steps (lpt.native.workers_held) and
    lets go when it returns, also when a step raises."""
    from dataclasses import replace

    from onnx import TensorProto, helper

    import lpt
    from lpt.backend import compile_model
    from lpt.errors import LptError

    engine = lpt.native._library.engine
    seen = []

    def watch(x):
        seen.append(engine.pool_holds())
        if not np.all(np.isfinite(x)):
            raise LptError("not finite")
        return [x]

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "relu.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    plan = compile_model(lpt.load(str(path)))
    plan = replace(plan, run_steps=[replace(plan.run_steps[0], run=watch)])
    before = engine.pool_holds()
    plan.run({"x": np.ones(2, np.float32)})
    with pytest.raises(LptError, match="not finite"):
        plan.run({"x": np.full(2, np.nan, np.float32)})
    assert seen == [before + 1, before + 1] and engine.pool_holds() == before


def test_a_region_of_two_threads_lets_the_workers_go_while_it_runs(monkeypatch):
    """Inside a plan's hold (workers_held), an onnxruntime region that runs on two threads lifts it for as long as
    its session runs (its threads take both cores), one of one thread keeps it, and the hold is back after."""
    import onnx_ir as ir
    from onnx import TensorProto, helper

    from lpt.backend import fallback

    engine = lpt.native._library.engine
    seen = []
    session = fallback._session

    class Watched:
        def __init__(self, inner):
            self.inner = inner

        def run(self, *args):
            seen.append(engine.pool_holds())
            return self.inner.run(*args)

    monkeypatch.setattr(fallback, "_session", lambda *a, **k: Watched(session(*a, **k)))
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 1024])])
    nodes = list(ir.serde.deserialize_model(helper.make_model(graph)).graph)
    x = np.ones((64, 1024), np.float32)
    before = engine.pool_holds()
    runners = [fallback.RegionRunner(nodes, {"": 13}, {}, {"y"}, threads=threads) for threads in (2, 1)]
    assert [r.threads for r in runners] == [2, 1]  # 65 536 values: not a small region
    for runner in runners:
        with lpt.native.workers_held():
            runner(x)
            assert engine.pool_holds() == before + 1
    runners[0](x)  # outside a hold: nothing to lift
    assert seen == [before, before + 1, before] and engine.pool_holds() == before
