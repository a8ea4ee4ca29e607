"""Running a model on lpt's int8 backend over a dataset, and checking it against onnxruntime."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from lpt.backend import Plan, compile_model, native_program
from lpt.crosscheck import TensorAgreement, quantized_tensor_agreement, run_fake_quantized, run_onnxruntime
from lpt.export.int8 import to_standard_int8
from lpt.kernels.int8_gemm import onnxruntime_saturation_note
from lpt.limits import bounded_threads
from lpt.model_io import clone
from lpt import native

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputAgreement:
    output: str
    against: str  # what lpt's output was compared with
    max_abs_diff: float
    share_equal: float
    note: str = ""  # why the two may differ, where that is known


@dataclass(frozen=True)
class EngineAgreement:
    """lpt's native engine against lpt's NumPy/MLAS kernels (the readable reference), on every integer tensor."""

    engines: dict[str, int]  # engine → int8 layers it computed
    max_lsb: int
    share_exact: float
    tensors: int
    programs: int = 0  # runs of steps fused into one native call (lpt.backend.native_program)
    programs_exact: bool = True  # their outputs equal, bit for bit, those of their steps run one by one


@dataclass
class CrossCheck:
    tensors: list[TensorAgreement] = field(default_factory=list)  # lpt vs the FQ model, end to end
    local: list[TensorAgreement] = field(default_factory=list)  # each layer fed the reference's integers
    outputs: list[OutputAgreement] = field(default_factory=list)
    export_notes: list[str] = field(default_factory=list)
    engines: dict[str, int] = field(default_factory=dict)  # engine → int8 layers it computed
    engine: EngineAgreement | None = None  # where some layer ran on the native engine

    @property
    def max_lsb(self) -> int:
        return max((t.max_lsb for t in self.tensors), default=0)

    @property
    def max_local_lsb(self) -> int:
        return max((t.max_lsb for t in self.local), default=0)

    @property
    def share_exact(self) -> float:
        total = sum(t.size for t in self.tensors)
        return sum(t.share_exact * t.size for t in self.tensors) / total if total else 1.0


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    plan: Plan
    seconds: float
    check: CrossCheck | None = None

    @property
    def op_split(self) -> dict[str, int]:
        return dict(self.plan.backend_counts())


def run_plan(plan: Plan, batches) -> tuple[dict[str, np.ndarray], float]:
    """Every batch through `plan`, outputs concatenated along the batch axis."""
    collected: dict[str, list[np.ndarray]] = {name: [] for name in plan.outputs}
    start = time.perf_counter()
    for batch in batches:
        for name, value in plan.run(batch).items():
            collected[name].append(value)
    seconds = time.perf_counter() - start
    return {name: np.concatenate(parts) for name, parts in collected.items()}, seconds


# The cross-check keeps every quantized tensor of both runs: it reads at most this many samples,
# and fewer where one sample's inputs are large (one 640×640 image: 4.9 MB).
CHECK_SAMPLES, CHECK_INPUT_BYTES = 8, 8 << 20


def check_samples(dataset) -> dict[str, np.ndarray]:
    """The first samples of a CalibrationData that the cross-check reads."""
    batch = next(iter(dataset.batches()))
    total = dataset.samples_in(batch)
    per_sample = sum(batch[n].nbytes for n, s in dataset.specs.items() if s.batch_axis is not None) / max(total, 1)
    wanted = max(1, min(CHECK_SAMPLES, int(CHECK_INPUT_BYTES // max(per_sample, 1))))
    return batch if total <= wanted or dataset.fixed_batch else dataset.part(batch, 0, wanted)


def cross_check(fq_model: ir.Model, int8_model: ir.Model, plan: Plan, batch: dict[str, np.ndarray]) -> CrossCheck:
    """lpt vs onnxruntime on the FQ model (per quantized tensor, in LSBs) and vs onnxruntime on lpt's export."""
    check = CrossCheck(tensors=quantized_tensor_agreement(int8_model, plan, fq_model, batch),
                       local=quantized_tensor_agreement(int8_model, plan, fq_model, batch, local=True))
    ours = plan.run(batch)
    exported, report = to_standard_int8(int8_model)
    check.export_notes = report.approximated
    check.engines = dict(plan.engine_counts())
    check.engine = engine_agreement(int8_model, plan, batch)
    fq_outputs, engine = run_fake_quantized(fq_model, batch, plan.outputs)
    references = {f"FQ model ({engine})": fq_outputs,
                  "exported int8 model (onnxruntime)": run_onnxruntime(exported, batch, plan.outputs)}
    notes = {"exported int8 model (onnxruntime)": (onnxruntime_saturation_note() or "") if _multiplies_u8_by_s8(exported)
             else ""}
    for against, theirs in references.items():
        for name in plan.outputs:
            difference = np.abs(ours[name].astype(np.float64) - theirs[name].astype(np.float64))
            check.outputs.append(OutputAgreement(name, against, float(difference.max(initial=0)),
                                                 float((difference == 0).mean()), notes.get(against, "")))
    return check


def _multiplies_u8_by_s8(model: ir.Model) -> bool:
    """Whether an integer product of `model` takes a uint8 source and int8 weights: the kernels that saturate
    on AVX2 (a dynamic model's u8 × u8 products do not)."""
    products = ("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul")
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type in products:
            weight = node.inputs[3 if node.op_type.startswith("QLinear") else 1]
            if weight is not None and weight.dtype == ir.DataType.INT8:
                return True
    return False


def engine_agreement(int8_model: ir.Model, plan: Plan, batch: dict[str, np.ndarray]) -> EngineAgreement | None:
    """Every integer tensor of `plan` against the same graph compiled on lpt's kernels alone, in LSBs;
    None when no layer of `plan` runs on the native engine."""
    engines = plan.engine_counts()
    if not any(native.is_native_engine(engine) for engine in engines):
        return None
    ours = plan.run(batch, keep=True)
    fused = plan.run(batch)  # the steps as a run takes them: native programs where they fused
    programs = sum(step.engine == native_program.ENGINE for step in plan.run_steps)
    programs_exact = all(np.array_equal(fused[name], ours[name], equal_nan=fused[name].dtype.kind == "f")
                         for name in plan.outputs)
    theirs = compile_model(int8_model, threads=1, native=False).run(batch, keep=True)
    worst, equal, total, tensors = 0, 0, 0, 0
    for name, value in ours.items():
        if value.dtype.kind in "iu" and name in theirs and name not in plan.constants:
            difference = np.abs(value.astype(np.int64) - theirs[name].astype(np.int64))
            worst = max(worst, int(difference.max(initial=0)))
            equal, total, tensors = equal + int((difference == 0).sum()), total + difference.size, tensors + 1
    return EngineAgreement(dict(engines), worst, equal / total if total else 1.0, tensors, programs, programs_exact)


def run(model, data, *, batch_size: int = 32, check: bool = False, threads: int = 0,
        batch_axes: dict[str, int | None] | None = None) -> RunResult:
    """Run a fake-quantized or int8 `model` (path or ir.Model) on lpt's backend over `data`.

    Returns outputs by name (concatenated over the data), the compiled plan (its int8/f32 split)
    and, with `check`, the cross-check against onnxruntime on the first samples (check_samples). `threads` is
    for the integer GEMM and the onnxruntime fallback (0: one per core). `batch_axes` ({input name:
    axis, or None for a fixed input}) overrides the batch axes guessed from the model.
    """
    from lpt import load
    from lpt.calibration.data import CalibrationData, input_specs, split_labels
    from lpt.data.sources import open_data
    from lpt.transformations.pipeline import transform

    threads = bounded_threads(threads)
    fq_model = load(model) if isinstance(model, (str, os.PathLike)) else model
    int8_model = clone(fq_model)
    transform(int8_model)
    plan = compile_model(int8_model, threads=threads)
    specs = input_specs(int8_model)
    data = open_data(data, fq_model, batch_axes=batch_axes)  # a folder: preprocessed as the model records
    inputs, _ = split_labels(data, None, [s.name for s in specs])  # a test file's labels are not inputs
    dataset = CalibrationData(inputs, specs, batch_size=batch_size, batch_axes=batch_axes)
    outputs, seconds = run_plan(plan, dataset.batches())
    result = RunResult(outputs, plan, seconds)
    if check:
        result.check = cross_check(fq_model, int8_model, plan, check_samples(dataset))
    return result
