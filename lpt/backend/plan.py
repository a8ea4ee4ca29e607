"""compile(graph) → Plan; Plan.run(feeds) is a short loop over prepared steps.

Compiling resolves each node (or fused chain of nodes) to a step once: int8 kernels with
their weights packed and compensation precomputed (lpt.backend.int8_steps), or one onnxruntime
session per region of nodes that stay in f32 (lpt.backend.fallback).
Intermediate buffers are dropped after their last use.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir

from lpt.backend.constant_folding import fold_integer_constants
from lpt.backend.fallback import RegionRunner, region_inputs, region_outputs
from lpt.backend.if_steps import try_if_step, try_squeeze_if_step
from lpt.backend import native_program
from lpt.backend.dynamic_layers import try_dynamic_layer_step
from lpt.backend.float_steps import (BACKEND as FLOAT_BACKEND, frames_signals, reads_model_input_from_a_table,
                                    try_float_step, try_spectrum_step)
from lpt.backend.int8_steps import try_int8_step, try_join_step, try_one_hot_step
from lpt.backend.onnx_int8_steps import try_onnx_int8_step
from lpt.backend.scan_steps import scans_at_once, try_scan_step
from lpt.backend.shape_steps import BACKEND as SHAPES, Remembered, by_small_values, shape_steps
from lpt.backend.specialized_regions import SpecializedRegion
from lpt.backend.step import Step
from lpt.backend.emulation import EMULATIONS, Emulation
from lpt.calibration.placement import spectral_power
from lpt.errors import DataError, LptError, ModelError
from lpt.graph.constants import const_array
from lpt.graph.ops import attribute
from lpt.limits import bounded_threads
from lpt.native import available as native_engine_available, workers_held

logger = logging.getLogger(__name__)


@dataclass
class Plan:
    steps: list[Step]
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, np.ndarray]
    # The steps as run: `steps` with runs of native steps fused into one call each (native_program)
    run_steps: list[Step] | None = None
    # run_steps, each with the tensors it reads and those no later step reads and no output is (dropped after
    # it; none after the last, whose run ends): a small model's run costs about as much as its Python
    _run_order: list[tuple[Step, tuple[str, ...], tuple[str, ...]]] = field(init=False, repr=False)

    def __post_init__(self):
        if self.run_steps is None:
            self.run_steps = self.steps
        last_use = {name: index for index, step in enumerate(self.run_steps) for name in step.inputs}
        self._run_order = [
            (step, step.inputs, tuple(name for name in dict.fromkeys(step.inputs)  # a step may read one tensor twice
                                      if last_use[name] == index < len(self.run_steps) - 1
                                      and name not in self.outputs and name not in self.constants))
            for index, step in enumerate(self.run_steps)]

    def run(self, feeds: dict[str, np.ndarray], keep: bool = False) -> dict[str, np.ndarray]:
        """Outputs by name; with `keep`, every intermediate tensor too (for per-layer checks)."""
        try:
            env = {n: feeds[n] for n in self.inputs}
        except KeyError:
            missing = [n for n in self.inputs if n not in feeds]
            raise DataError(f"missing input(s) {missing}; the model expects {self.inputs}") from None
        # The constants are read where they lie: copying them into `env` each run cost a small
        # model more than its steps (hundreds of initializers).
        constants = self.constants
        if keep:
            with workers_held():
                for step in self.steps:
                    env.update(zip(step.outputs, step.run(*[env[n] if n in env else constants[n] for n in step.inputs])))
            return {**constants, **env}
        with workers_held():  # the engine's workers stay awake for its next step
            for step, reads, dropped in self._run_order:
                env.update(zip(step.outputs, step.run(*[env[n] if n in env else constants[n] for n in reads])))
                for name in dropped:
                    del env[name]
        return {n: env[n] if n in env else constants[n] for n in self.outputs}

    def backend_counts(self) -> Counter:
        """How many nodes ran on each backend: the int8/f32 split a run reports."""
        counts = Counter()
        for step in self.steps:
            # a specialized region says what ran it last: lpt's plan for the shapes, or onnxruntime
            counts[getattr(step.run, "ran_on", step.backend)] += len(step.nodes)
        return counts

    def engine_counts(self) -> Counter:
        """How many int8 layers (convolutions, matmuls) each engine computes, as the last run computed
        them (an s16 convolution by Winograd or not, which depends on the source's shape); an If's
        branches' layers too, each branch's."""
        from lpt.native import layer_engine

        # (a dynamic layer's step starts at its quantize, not its product)
        counts = Counter(layer_engine(step.engine, step.native) for step in self.steps
                         if step.layer is not None or any(op in _PRODUCTS for op in step.op_types))
        for step in self.steps:
            for branch in step.plans:
                counts += branch.engine_counts()
        return counts

    def fallback_ops(self) -> Counter:
        return Counter(op for s in self.steps if s.backend != "int8 kernel" for op in s.op_types)


def _typed(model: ir.Model) -> ir.Model:
    """A copy with the value types onnx can infer (the int8 step builders read ranks and types)."""
    from lpt.model_io import to_proto

    proto = to_proto(model)
    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception as err:  # noqa: BLE001 - what it cannot infer, the f32 regions' sessions do
        logger.info("shape inference failed before compiling (%s)", str(err).splitlines()[0] if str(err) else err)
    return ir.serde.deserialize_model(proto)


def compile_model(model: ir.Model, threads: int = 0, native: bool = True,
                  emulate: str | Emulation | None = None, inputs_from_lpt: bool = False,
                  small_products: bool = False) -> Plan:
    """Resolve every node of `model` to a step: fused int8 chains on lpt's kernels, f32 regions on onnxruntime.

    `threads` is the thread count of the integer GEMM and of the onnxruntime sessions (0: one per core).
    With `native` (the default), int8 layers run on lpt's oneDNN engine where it takes them; without,
    every int8 step runs on lpt's NumPy/MLAS kernels, the readable reference the engine is checked against.
    `emulate="avx2"` computes the int8 layers as onnxruntime's u8 × s8 kernels on an AVX2 CPU without
    VNNI do, int16 pair saturation included (lpt.backend.emulation); such steps' `run.statistics`
    says what saturated.

    `inputs_from_lpt`: the model is an If's branch (lpt.backend.if_steps) or a specialized region
    (lpt.backend.specialized_regions), whose inputs lpt's steps make, so the float32 ops that read them are taken
    as those between int8 steps are. `small_products`: float32 MatMuls of a few rows are lpt's too
    (float_steps.FEW_ROWS, for a specialized region).

    Joins (an Add or Concat of dequantized branches) are matched first, since they reach back
    over both branches; then every other node in order, and the float32 ops between int8 steps
    (lpt.backend.float_steps), and those only native programs read (_ends_a_region). What no step claims stays in f32,
    and the steps are ordered (`_schedule`) so that f32 nodes run in as few regions as possible.
    """
    from lpt.model_io import used_domains

    if emulate is not None and not isinstance(emulate, Emulation) and emulate not in EMULATIONS:
        raise LptError(f"unknown emulation {emulate!r}: choose one of {', '.join(EMULATIONS)}")
    threads = bounded_threads(threads)
    model = _typed(model)
    if fold_integer_constants(model):
        model = _typed(model)  # the folded values' shapes reach their readers
    graph = model.graph
    opsets = {**{d: 1 for d in used_domains(model)}, **dict(model.opset_imports)}
    constants = {name: value.const_value.numpy() for name, value in graph.initializers.items()}
    int8_steps: list[tuple[Step, list[ir.Node]]] = []
    claimed: set[int] = set()

    def claim(step: Step, nodes: list[ir.Node]) -> None:
        claimed.update(id(n) for n in nodes)
        int8_steps.append((step, nodes))

    for node in graph:
        fused = try_join_step(node)
        if fused is not None and not any(id(n) in claimed for n in fused[1]):
            claim(*fused)
    f32_nodes = []
    # scales computed at run time from a tensor's range: lpt's own float32 results would move them
    own_results = not any(node.op_type == "DynamicQuantizeLinear" for node in graph)
    spectrum = set(spectral_power(graph)) if own_results else set()  # the layers of a power spectrum kept in f32
    for node in graph:
        if id(node) in claimed:
            continue
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            constants[node.outputs[0].name] = const_array(node.outputs[0])  # folded: no step at run time
            continue
        fused = ((native and emulate is None and try_dynamic_layer_step(node, threads))
                 or try_int8_step(node, threads, native, emulate) or try_one_hot_step(node)
                 or try_onnx_int8_step(node, threads, native)
                 or try_scan_step(node, opsets, threads, native, emulate)
                 or try_if_step(node, opsets, claimed, threads, native, emulate))
        if fused is None and node in spectrum and _reads_no_f32_region(node, claimed):
            fused = try_spectrum_step(node)
        if fused is None and (squeezed := try_squeeze_if_step(node, FLOAT_BACKEND)) is not None:
            fused = squeezed if _reads_no_f32_region(squeezed[1][0], claimed) else None  # its Shape's x is lpt's
        if fused is None and (_between_int8_steps(node, claimed, constants, own_results, inputs_from_lpt)
                              or reads_model_input_from_a_table(node, constants)
                              or (frames_signals(node, spectrum) and _reads_no_f32_region(node, claimed))):
            if not _joins_other_axes(node) or _reads_no_f32_region(node, claimed):
                fused = try_float_step(node, own_results, small_products)
        if fused is not None and not any(id(n) in claimed for n in fused[1]):
            claim(*fused)
            if len(fused[1]) > 1:  # a step may take nodes before its own (a squeezing If its condition)
                f32_nodes = [n for n in f32_nodes if id(n) not in claimed]
        else:
            f32_nodes.append(node)
    outputs = [v.name for v in graph.outputs]
    if int8_steps:  # (a plan that is all onnxruntime stays one session)
        shapes = shape_steps(f32_nodes, set(outputs), constants, opsets)
        for fused in shapes:
            claim(*fused)
        # a node that reads only those, lpt's steps and constants may be lpt's now: a Reshape to a computed target
        for node in [n for n in f32_nodes if id(n) not in claimed]:
            if _reads_no_f32_region(node, claimed) and _between_int8_steps(node, claimed, constants, own_results,
                                                                           inputs_from_lpt):
                fused = try_float_step(node, own_results, small_products)
                if fused is not None and not any(id(n) in claimed for n in fused[1]):
                    claim(*fused)
        native_nodes = {id(n) for step, nodes in int8_steps if step.native is not None for n in nodes}
        for node in reversed([n for n in f32_nodes if id(n) not in claimed]):  # a reader before its source
            if _ends_a_region(node, native_nodes):
                fused = try_float_step(node, own_results, small_products)
                if fused is not None and fused[0].native is not None and not any(id(n) in claimed for n in fused[1]):
                    claim(*fused)
                    native_nodes.update(id(n) for n in fused[1])
        # Shape arithmetic only onnxruntime's nodes read stays in their region, which runs anyway: as steps of
        # their own, silero_vad_16k_op15's four added four calls to its plan and removed no region.
        for step, nodes in shapes:
            inside = {id(n) for n in nodes}
            if not any(id(user) in claimed and id(user) not in inside
                       for n in nodes for v in n.outputs for user, _ in v.uses()):
                claimed.difference_update(inside)
                int8_steps[:] = [unit for unit in int8_steps if unit[0] is not step]
        f32_nodes = [n for n in f32_nodes if id(n) not in claimed]
    steps, graph_outputs = [], set(outputs)
    for unit in _schedule(graph, int8_steps, f32_nodes):
        if isinstance(unit, Step):
            steps.append(unit)
            continue
        needed = {v.name for v in region_outputs(unit, graph_outputs)}
        runner = RegionRunner(unit, opsets, constants, needed, threads, alone=not int8_steps)
        backend = runner.backend
        if int8_steps and by_small_values(unit, [v for v in region_inputs(unit) if v.name not in constants]):
            runner = Remembered(runner, by_value=True)
        elif (int8_steps and native and native_engine_available() and emulate is None and own_results
              and any(n.op_type == "If" for n in unit)):  # (the NumPy forms of its float32 steps are slow)
            runner = SpecializedRegion(runner, threads)
        steps.append(Step(runner, tuple(runner.input_names), tuple(runner.output_names),
                          tuple(n.name for n in unit), tuple(n.op_type for n in unit), backend))
    run_steps = native_program.fuse(steps, outputs, threads, constants) if native and emulate is None else steps
    run_steps = scans_at_once(run_steps, threads)
    plan = Plan(steps, [v.name for v in graph.inputs if v.name not in constants], outputs, constants, run_steps)
    logger.info("compiled %d steps: %s", len(steps), dict(plan.backend_counts()))
    return plan


def _reads_no_f32_region(node: ir.Node, claimed: set[int]) -> bool:
    """Whether each tensor `node` reads is a constant, the model's input or a step's: taking it then cuts no
    onnxruntime region in two. silero_vad_16k_op15's STFT reads a reflection Pad whose pads come from the
    input's shape: its convolution alone as lpt's cut that region into two and took its plan 0.28-0.43 →
    0.49-0.56 ms."""
    producers = [v.producer() for v in node.inputs if v is not None]
    return all(p is None or p.op_type == "Constant" or id(p) in claimed for p in producers)


def _ends_a_region(node: ir.Node, native_nodes: set[int]) -> bool:
    """Whether every reader of `node` (a float32 op) is an instruction of a native program, so that taking it as
    one too ends its onnxruntime region before it and adds no step. basic_pitch_nmp's batch normalization after
    its CQT, a Mul and an Add by one value on [1, 172, 309, 1], took onnxruntime 0.45 ms each (its broadcast
    over a last axis of 1); taken, its plan 5.6-5.8 → 4.7-4.9 ms. magika's last Reshape was a region of its
    own: 1.13 → 1.07 ms. Not where the readers are steps of their own (ddddocr_common_old_dynq's dynamic
    quantizations, after twenty Muls and Adds: as steps of lpt's, 12.3-12.6 → 12.8-14.5 ms), nor a Transpose
    (dnsmos_sig_bak_ovr's two of [1, 161, 900] after its STFT took 0.24 ms as lpt's, its plan 11.6 → 11.9 ms)."""
    readers = [user for v in node.outputs for user, _ in v.uses()]
    return node.op_type != "Transpose" and bool(readers) and all(id(reader) in native_nodes for reader in readers)


def _joins_other_axes(node: ir.Node) -> bool:
    """A Concat along other than the channels: lpt's step only where each part is lpt's, a constant or an input
    (_reads_no_f32_region). basic_pitch_nmp's CQT stacks its real and imaginary parts and its octaves so,
    between float32 ops onnxruntime runs: as lpt's steps they cut that region in three, and its plan took
    5.72-5.74 → 5.85-6.21 ms; its harmonic stacking, whose parts are all lpt's, joins its native programs."""
    return node.op_type == "Concat" and attribute(node, "axis", 1) not in (1, 1 - len(node.inputs[0].shape or ()))


def _between_int8_steps(node: ir.Node, claimed: set[int], constants: dict, own_results: bool = True,
                        inputs_from_lpt: bool = False) -> bool:
    """Whether one of lpt's steps makes a tensor `node` reads at run time, so that a float32 op there keeps
    the native program whole (lpt.backend.float_steps). Not where it would cut an onnxruntime region in two:
    when the graph's f32 part also feeds it, and a node reading its output would stay f32 (neither a float
    step nor a quantize), taking it leaves two sessions where there was one (a LayerNorm written out as
    ReduceMean, Sub, Pow, ... whose ReduceMean lpt does not take)."""
    read = [v for v in node.inputs if v is not None and v.name not in constants]
    producers = [v.producer() for v in read if v.producer() is not None]
    reads_an_input = inputs_from_lpt and len(producers) < len(read)
    if not reads_an_input and not any(id(p) in claimed for p in producers):
        return False
    if all(id(p) in claimed for p in producers):
        return True
    readers = [user for v in node.outputs for user, _ in v.uses()]
    steps = [try_float_step(reader, own_results) for reader in readers]
    taken = {id(n) for step in steps if step is not None for n in step[1]}  # a reader's step may take others
    return all(reader.op_type in _QUANTIZES or id(reader) in taken for reader in readers)


_QUANTIZES = ("QuantizeLinear", "Quantize")  # an int8 step starts there
_PRODUCTS = ("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul")  # a standard int8 op's layer


def _schedule(graph: ir.Graph, int8_steps: list[tuple[Step, list[ir.Node]]], f32_nodes: list[ir.Node]) -> list:
    """Int8 steps and f32 regions (lists of nodes) in an order that runs: every input is made before it is read.

    A topological order of the units (int8 steps, single f32 nodes) that, while it is emitting f32
    nodes, takes another ready f32 node before any int8 step; consecutive f32 nodes then form one
    region. Any run of consecutive units in a topological order can execute as one step.
    """
    position = {id(node): i for i, node in enumerate(graph)}
    # shape arithmetic as soon as it can run: it does not then cut a native program in two
    units = [(-1 if step.backend == SHAPES else max(position[id(n)] for n in nodes), step, nodes)
             for step, nodes in int8_steps]
    units += [(position[id(n)], None, [n]) for n in f32_nodes]
    producer = {}
    for index, (_, _, nodes) in enumerate(units):
        for node in nodes:
            for value in node.outputs:
                producer[id(value)] = index
    waiting_on = [set() for _ in units]
    readers = [[] for _ in units]
    for index, (_, _, nodes) in enumerate(units):
        for value in region_inputs(nodes):
            source = producer.get(id(value))
            if source is not None and source != index and source not in waiting_on[index]:
                waiting_on[index].add(source)
                readers[source].append(index)
    ready = {"f32": [], "int8": []}
    for index, (_, step, _) in enumerate(units):
        if not waiting_on[index]:
            heapq.heappush(ready["int8" if step is not None else "f32"], (units[index][0], index))
    order, kind = [], "int8"
    while ready["f32"] or ready["int8"]:
        if not ready[kind]:
            kind = "f32" if kind == "int8" else "int8"
        _, index = heapq.heappop(ready[kind])
        order.append(index)
        for reader in readers[index]:
            waiting_on[reader].discard(index)
            if not waiting_on[reader]:
                heapq.heappush(ready["int8" if units[reader][1] is not None else "f32"], (units[reader][0], reader))
    if len(order) != len(units):
        raise ModelError("the graph has a cycle: its nodes cannot be ordered")
    scheduled: list = []
    for index in order:
        _, step, nodes = units[index]
        if step is not None:
            scheduled.append(step)
        elif scheduled and isinstance(scheduled[-1], list):
            scheduled[-1].extend(nodes)
        else:
            scheduled.append(list(nodes))
    return scheduled

