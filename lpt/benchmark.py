"""Latency of lpt's int8 backend against onnxruntime, measured in one run (`lpt bench`).

Each engine runs the same batch repeatedly; the median of the repeats is reported, and the
ratios are what to read (this machine is shared and noisy). The engines take turns in short
blocks over several rounds, so a slow minute on a shared machine lands on all of them rather
than on whichever ran then; within a block an engine runs back to back, as it would in use.
Each block starts after a pause (SETTLE_SECONDS), so no engine pays for another's thread pool
still spinning: onnxruntime's workers spin on after a run, and lpt's first runs after a block of
onnxruntime's took 1.3-2.5x their time (plcmos_v2, 2 threads). Threads are pinned to the same
count for all: onnxruntime's intra-op pool, lpt's integer GEMM (MLAS, in its own onnxruntime
sessions), the BLAS pool of lpt's f32 routes, and OpenVINO's CPU plugin.

OpenVINO runs where it is installed (`pip install 'lpt[bench]'`): it reads the same FQ model
and its CPU plugin's low precision transformations make it int8, the peer lpt is measured
against. Where it is missing or refuses the model, `unavailable` says why.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from threadpoolctl import threadpool_limits

from lpt.backend import compile_model, native_program
from lpt.export.portable import to_portable
from lpt.limits import bounded_threads
from lpt.errors import ModelError
from lpt.model_io import clone, to_proto
from lpt.summary import is_quantized
from lpt.transformations.pipeline import transform


# The CPU flags that decide which int8 kernels each engine runs, fastest first: AMX tiles, AVX-512 and
# AVX dot products (exact u8×s8 sums), else AVX2's saturating pairs (README: int8 on AVX2 CPUs).
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "avx2")


def machine(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    """What a figure was measured on: the CPU's name, its int8 instruction sets and lpt's native route.
    Speed figures from two machines do not compare, and these machines come with either kind of CPU."""
    from lpt import native

    name, flags = platform.processor() or "unknown", set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:  # not Linux: the name platform gives, flags unknown
        pass
    return {"cpu": name, "int8 instructions": " ".join(f for f in INT8_FLAGS if f in flags) or "unknown",
            "lpt native route": (native.route() or "off") if native.available() else "off"}


def machine_line(where: dict[str, str]) -> str:
    """machine()'s record as the one line the benchmarks print above their figures."""
    return f"{where['cpu']} ({where['int8 instructions']}), lpt route {where['lpt native route']}"


@dataclass
class BenchResult:
    threads: int
    repeats: int
    median_ms: dict[str, float] = field(default_factory=dict)
    profile: list[tuple[str, float]] = field(default_factory=list)  # (step, median ms), slowest first
    unavailable: dict[str, str] = field(default_factory=dict)  # engine → why it did not run
    machine: dict[str, str] = field(default_factory=machine)

    def ratios(self, baseline: str = "onnxruntime fp32") -> dict[str, float]:
        base = self.median_ms.get(baseline)
        return {k: v / base for k, v in self.median_ms.items()} if base else {}

    def to_dict(self) -> dict:
        return {"threads": self.threads, "repeats": self.repeats, "median_ms": self.median_ms,
                "ratio_to_onnxruntime_fp32": self.ratios(), "profile_ms": dict(self.profile),
                "unavailable": self.unavailable, "machine": self.machine}


SETTLE_SECONDS = 0.1  # the pause before each block: spinning workers of the engine before have stopped
# A block runs at least this long: a model of 0.05 ms would otherwise be timed on the first two calls
# after a pause, which measures waking up (caches, threads) more than the model.
MIN_BLOCK_SECONDS = 0.02


def median_ms_in_turns(engines: dict[str, Callable[[], object]], repeats: int, rounds: int = 5) -> dict[str, float]:
    """Median milliseconds per call of each engine, the engines taking turns in `rounds` blocks of at
    least `repeats` / `rounds` calls and MIN_BLOCK_SECONDS each."""
    rounds = max(1, min(rounds, repeats))
    times: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(rounds):
        block = repeats // rounds + (round_ < repeats % rounds)
        for name, function in engines.items():
            time.sleep(SETTLE_SECONDS)
            function()  # warm: caches, and the thread pool awake
            calls, began = 0, time.perf_counter()
            while calls < block or time.perf_counter() - began < MIN_BLOCK_SECONDS:
                start = time.perf_counter()
                function()
                times[name].append((time.perf_counter() - start) * 1e3)
                calls += 1
    return {name: statistics.median(t) for name, t in times.items()}


def _session(model, threads: int, optimize: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    proto = model if not isinstance(model, ir.Model) else to_proto(to_portable(model))
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def benchmark(fq_model: ir.Model, feeds: dict[str, np.ndarray], *, fp32_model: ir.Model | None = None,
              threads: int = 2, repeats: int = 20, profile: bool = True) -> BenchResult:
    """Median latency on `feeds` of lpt's int8 plan, onnxruntime on the FQ (QDQ) model with its
    own int8 kernels, OpenVINO on the same FQ model where installed, and onnxruntime on the fp32
    model when given."""
    if not is_quantized(fq_model):
        raise ModelError("the model is not quantized (no fake-quantization, no int8 layers): lpt's plan would run it "
                         "in float32; quantize it first (lpt quantize writes NAME.fq.onnx)")
    threads = bounded_threads(threads)
    int8 = clone(fq_model)
    transform(int8)
    result = BenchResult(threads, repeats)
    with threadpool_limits(limits=threads):
        plan = compile_model(int8, threads=threads)
        engines = {"lpt int8": lambda: plan.run(feeds)}
        qdq = _session(fq_model, threads, optimize=True)
        engines["onnxruntime QDQ"] = lambda: qdq.run(None, feeds)
        openvino = _openvino_request(fq_model, threads, result.unavailable)
        if openvino is not None:
            engines["openvino int8"] = lambda: openvino.infer(feeds)
        if fp32_model is not None:
            fp32 = _session(fp32_model, threads, optimize=True)
            engines["onnxruntime fp32"] = lambda: fp32.run(None, feeds)
        result.median_ms = median_ms_in_turns(engines, repeats)
        if profile:
            result.profile = _profile(plan, feeds, max(3, repeats // 4))
    return result


def _openvino_request(fq_model: ir.Model, threads: int, unavailable: dict[str, str]):
    """An OpenVINO infer request for the FQ model on CPU, or None (the reason in `unavailable`)."""
    try:
        import openvino
    except ImportError:
        unavailable["openvino int8"] = "not installed (pip install 'lpt[bench]')"
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="lpt-bench-") as folder:
            path = os.path.join(folder, "model.onnx")
            with open(path, "wb") as f:  # OpenVINO reads ONNX from a file
                f.write(to_proto(to_portable(fq_model)).SerializeToString())
            core = openvino.Core()
            compiled = core.compile_model(core.read_model(path), "CPU",
                                          {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
        return compiled.create_infer_request()
    except Exception as err:  # noqa: BLE001 - a peer refusing the model is a result, not an error of lpt's
        unavailable["openvino int8"] = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return None


def _profile(plan, feeds, repeats: int) -> list[tuple[str, float]]:
    """Median time per step as the plan runs them, and per instruction inside a native program (named
    "in program: ..."): where lpt's time goes, slowest first."""
    env = {**plan.constants, **feeds}
    steps = plan.run_steps
    timings: dict[str, list[float]] = {}
    for _ in range(repeats):
        for step in steps:
            start = time.perf_counter()
            outputs = step.run(*[env[n] for n in step.inputs])
            timings.setdefault(_step_name(step), []).append((time.perf_counter() - start) * 1e3)
            env.update(zip(step.outputs, outputs))
            if isinstance(step.run, native_program.ProgramRun):
                for part, seconds in step.run.instruction_seconds():
                    timings.setdefault(f"in program: {_step_name(part)}", []).append(seconds * 1e3)
    rows = [(name, statistics.median(t)) for name, t in timings.items()]
    return sorted(rows, key=lambda r: -r[1])


def _step_name(step) -> str:
    if step.engine == native_program.ENGINE:
        return f"native program of {len(step.nodes)} nodes [{step.nodes[0]} .. {step.nodes[-1]}]"
    return f"{'+'.join(step.op_types)} [{step.nodes[0]}]"
