"""How far lpt's int8 execution is from a reference run, in LSBs of each quantized tensor.

Every quantize node of the int8 graph (QuantizeLinear, lpt::Quantize) reads an f32 tensor that
also exists, under the same name, in the fake-quantized model. The reference (onnxruntime on
the FQ model, with graph optimizations off so that it stays an f32 simulation; ONNX's
reference evaluator where onnxruntime cannot run it) gives that tensor; quantizing it with
the node's own parameters gives the reference integers, which lpt's integers are compared to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from lpt.backend.chains import is_quantize, read_quantization
from lpt.backend.plan import Plan
from lpt.export.portable import to_portable
from lpt.model_io import to_proto
from lpt.reference import run_reference


@dataclass(frozen=True)
class TensorAgreement:
    tensor: str  # the f32 tensor's name in the FQ model
    max_lsb: int
    share_exact: float
    size: int


def run_onnxruntime(model: ir.Model | onnx.ModelProto, feeds: dict, outputs: list[str] | None = None,
                    optimize: bool = False, threads: int = 0) -> dict[str, np.ndarray]:
    """Run with onnxruntime, any intermediate tensor in `outputs` exposed. Without `optimize` its
    QDQ fusions stay off, so a fake-quantized model is simulated in f32 as written."""
    proto = model if isinstance(model, onnx.ModelProto) else to_proto(to_portable(model))
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    names = outputs or [o.name for o in proto.graph.output]
    present = {o.name for o in proto.graph.output}
    for name in names:
        if name not in present:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds)))


def run_fake_quantized(fq_model: ir.Model, feeds: dict, outputs: list[str]) -> tuple[dict[str, np.ndarray], str]:
    """The FQ model's tensors, and who computed them: onnxruntime when it can run the model, else
    ONNX's reference evaluator (OpenVINO's FakeQuantize op is unknown to onnxruntime)."""
    try:
        return run_onnxruntime(fq_model, feeds, outputs), "onnxruntime"
    except Exception:  # noqa: BLE001 - onnxruntime refuses the model: fall back to the reference evaluator
        return run_reference(to_portable(fq_model), feeds, outputs), "onnx reference evaluator"


def quantized_tensor_agreement(int8_model: ir.Model, plan: Plan, fq_model: ir.Model,
                               feeds: dict[str, np.ndarray], *, local: bool = False) -> list[TensorAgreement]:
    """Per quantize node of the int8 graph: lpt's integers vs the reference's, in LSBs.

    End to end (default), a one-LSB difference at one tensor, which f32 rounding at a tie
    produces, travels on and can grow through the layers after it. With `local`, every step
    reads the reference's integers for the quantized tensors it consumes, so each tensor's
    figure is what its own layer adds.
    """
    fq_names = {v.name for n in ir.traversal.RecursiveGraphIterator(fq_model.graph) for v in n.outputs}
    fq_names |= {v.name for v in fq_model.graph.inputs}
    targets = []
    for node in int8_model.graph:
        if is_quantize(node) and node.inputs[0].name in fq_names:
            quantization = read_quantization(node)
            if quantization is not None:
                targets.append((node.inputs[0].name, node.outputs[0].name, quantization.quantize))
    if not targets:
        return []
    reference, _ = run_fake_quantized(fq_model, feeds, sorted({t[0] for t in targets}))
    expected = {quantized: function(reference[source]) for source, quantized, function in targets}
    ours = _run_steps(plan, feeds, expected if local else {}, keep=set(expected))
    result = []
    for source, quantized, _ in targets:
        if quantized not in ours:  # fused away inside a step: its integers are not materialized
            continue
        difference = np.abs(ours[quantized].astype(np.int64) - expected[quantized].astype(np.int64))
        result.append(TensorAgreement(source, int(difference.max(initial=0)), float((difference == 0).mean()),
                                      int(difference.size)))
    return result


def _run_steps(plan: Plan, feeds: dict[str, np.ndarray], substitutes: dict[str, np.ndarray], keep: set[str]) -> dict:
    """The tensors `keep` of a plan run (others are dropped after their last use); a step reads
    `substitutes[name]` instead of the computed value."""
    env = {**plan.constants, **feeds}
    last_use = {name: index for index, step in enumerate(plan.steps) for name in step.inputs}
    for index, step in enumerate(plan.steps):
        outputs = step.run(*[substitutes[n] if n in substitutes else env[n] for n in step.inputs])
        env.update(zip(step.outputs, outputs))
        for name in step.inputs:
            if last_use[name] == index and name not in keep and name not in plan.constants:
                env.pop(name, None)
    return env
