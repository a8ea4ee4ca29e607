"""Ops without an lpt kernel run through onnxruntime: one session per f32 region, built from the original nodes.

This is the "maintained implementation" for the part of the graph that stays in f32 (Softmax,
LayerNormalization, a detection head, shape arithmetic...). A region is a run of such nodes
that the plan can execute as one step; its session holds exactly those nodes, its constants as
initializers, and declares only the element types of its inputs: onnxruntime infers every other
type and shape itself, so a value the model left untyped costs nothing. An input whose type the
graph does not say is typed from the first array it receives.

Where onnxruntime refuses the region (an op it has no kernel for at that type), the region is
split in halves, each run as one session or split again, until the nodes it refuses run alone, on
ONNX's reference evaluator: a few sessions for a 100k-node region, not one per node (each holds
threads). A node that fails as it runs is a ModelError naming it, with onnxruntime's reason.
"""

from __future__ import annotations

import logging
import math
import re

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper
from onnx.reference import ReferenceEvaluator

from lpt import limits
from lpt.backend.conv1d_as_matmul import conv1d_as_matmul
from lpt.errors import ModelError, size_text
from lpt.native import workers_let_go
from lpt.reference import CUSTOM_OPS

logger = logging.getLogger(__name__)


def region_inputs(nodes: list[ir.Node]) -> list[ir.Value]:
    """Values the nodes read and do not produce, in first-use order: their inputs and what their subgraphs capture."""
    produced = {id(v) for n in nodes for v in n.outputs}
    seen, result = set(), []
    for node in nodes:
        for value in [*node.inputs, *_captured(node)]:
            if value is not None and id(value) not in produced and id(value) not in seen:
                seen.add(id(value))
                result.append(value)
    return result


def region_outputs(nodes: list[ir.Node], graph_outputs: set[str]) -> list[ir.Value]:
    """The values `nodes` make that the graph outputs or a node outside them reads (a subgraph's reads too)."""
    inside = {id(n) for n in nodes}
    return [v for n in nodes for v in n.outputs
            if v.name in graph_outputs or any(id(user) not in inside for user, _ in v.uses())]


def _captured(node: ir.Node) -> list[ir.Value]:
    """Outer-scope values that the subgraphs of `node` (If, Loop, Scan bodies) read."""
    graphs = [g for a in node.attributes.values() if a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
              for g in (a.value if a.type == ir.AttributeType.GRAPHS else [a.value])]
    if not graphs:
        return []
    defined, used = set(), []
    for graph in graphs:
        for inner in [graph, *(g for n in ir.traversal.RecursiveGraphIterator(graph) for a in n.attributes.values()
                               if a.type == ir.AttributeType.GRAPH for g in [a.value])]:
            defined.update(id(v) for v in [*inner.inputs, *inner.initializers.values()])
        for n in ir.traversal.RecursiveGraphIterator(graph):
            defined.update(id(v) for v in n.outputs)
            used.extend(v for v in n.inputs if v is not None)
    return [v for v in used if id(v) not in defined]


# A region between steps of lpt's own wakes its sleeping threads at each op it runs in parallel; where its
# work is small, that costs more than the second thread gains. The work is judged from the model (the
# weights its nodes read, the sizes the graph gives its tensors), never from timing, so the choice, and
# onnxruntime's bits, are the same at every run. silero_vad_16k_op15 (its STFT and LSTM regions read
# 0.12 M and 0.13 M weights, its tensors are small): 0.86-0.91 of its time with two threads (12 rounds
# alternating in one process); magika (regions of 0.5 M values) stays at two; ddddocr's LSTM region reads
# 4.2 M weights. All regions on one thread (stop 28) made ddddocr_common 1.12-1.27x slower.
SMALL_REGION_WEIGHTS, SMALL_REGION_VALUES = 1 << 20, 1 << 15


def small_region(nodes: list[ir.Node], constants: dict[str, np.ndarray]) -> bool:
    """Whether the region's nodes read fewer than SMALL_REGION_WEIGHTS constant values, their subgraphs'
    (an If's branches) counted, and none of the tensors they read or make has SMALL_REGION_VALUES values
    or more as far as the graph says (a dimension it does not know counted as 1)."""
    for value in [v for n in nodes for v in [*n.inputs, *n.outputs] if v is not None and v.name not in constants]:
        if value.shape is not None and math.prod(d if isinstance(d, int) else 1 for d in value.shape) >= SMALL_REGION_VALUES:
            return False
    count = sum(np.size(a) for a in constants.values())
    for node in nodes:
        for attr in node.attributes.values():
            if attr.type not in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                continue
            for graph in attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]:
                count += sum(v.const_value.size for v in graph.initializers.values() if v.const_value is not None)
                for inner in ir.traversal.RecursiveGraphIterator(graph):
                    count += sum(a.value.size for a in inner.attributes.values() if a.type == ir.AttributeType.TENSOR)
    return count < SMALL_REGION_WEIGHTS


# A recurrent op runs its parallel work once per time step, one step after the other: sleeping threads
# are woken at each. A region holding one (its subgraphs counted) spins while it runs and stops when
# the run ends, so the int8 kernels' threads keep the cores after it: ddddocr_common's bidirectional
# LSTM region over 32 steps took 5.5 ms instead of 6.6-6.7, its plan 0.96 of its time (the median of 7
# rounds alternating in one process, 0.88-1.03). Spinning after the run too made the plan 1.15x slower.
RECURRENT_OPS = ("LSTM", "GRU", "RNN", "DynamicQuantizeLSTM")


def holds_recurrent_op(nodes: list[ir.Node]) -> bool:
    return any(inner.op_type in RECURRENT_OPS for node in nodes
               for inner in [node, *(n for a in node.attributes.values() if a.type == ir.AttributeType.GRAPH
                                     for n in ir.traversal.RecursiveGraphIterator(a.value))])


class RegionRunner:
    """Runs a region of f32 nodes as one onnxruntime session; `backend` says what ran it.

    With `alone` (the plan has no step of lpt's own), its threads spin between ops and after a run, as
    an onnxruntime session's do by default; else they sleep, and leave the cores to the int8 kernels'
    threads, and a region of little work runs on one thread (small_region says why), and a region with
    a recurrent op spins only while it runs (RECURRENT_OPS says why)."""

    def __init__(self, nodes: list[ir.Node], opsets: dict[str, int], constants: dict[str, np.ndarray],
                 needed_outside: set[str], threads: int = 1, alone: bool = False):
        external = region_inputs(nodes)
        self._constants = {v.name: constants[v.name] for v in external if v.name in constants}
        if not alone and small_region(nodes, self._constants):
            threads = 1
        self.nodes, self.opsets, self.threads, self.alone = nodes, opsets, threads, alone
        self.spin_while_running = not alone and threads > 1 and holds_recurrent_op(nodes)
        self._input_values = [v for v in external if v.name not in constants and v.name]
        self.input_names = [v.name for v in self._input_values]
        self.output_names = [v.name for n in nodes for v in n.outputs if v.name in needed_outside]
        self.backend = "onnxruntime"
        self._run = None
        if all(v.dtype is not None for v in self._input_values):
            self._build([v.dtype for v in self._input_values])

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        if self._run is None:  # some input was untyped in the graph: its first array says the type
            self._build([ir.DataType.from_numpy(np.asarray(a).dtype) for a in arrays])
        return self._run(dict(zip(self.input_names, arrays)))

    def _build(self, dtypes: list[ir.DataType]) -> None:
        proto = self.model_proto(dtypes)
        try:
            session = _session(conv1d_as_matmul(proto), self.threads, self.alone, self.spin_while_running)
        except Exception as err:  # noqa: BLE001 - e.g. NOT_IMPLEMENTED for a type: split the region
            if len(self.nodes) == 1:
                node, why = self.nodes[0], " ".join(str(err).split()) or type(err).__name__
                logger.info("onnxruntime cannot run %s (%s): ONNX's reference evaluator runs it", node.name, why)
                try:
                    evaluator = ReferenceEvaluator(proto, new_ops=CUSTOM_OPS)
                except Exception:  # noqa: BLE001 - an op neither knows: say which
                    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
                    raise ModelError(f"node {node.name!r}: no runtime lpt uses has the op {op} "
                                     f"(onnxruntime: {why[:200]})") from None
                self.backend = "onnx reference"
                self._run = lambda feeds: evaluator.run(self.output_names, feeds)
            else:
                self._build_halves()
            return

        # Its threads take both cores: the engine's workers sleep meanwhile (lpt.native.workers_let_go).
        # dnsmos_sig_bak_ovr's STFT region in its plan, Zen 4, 2 threads: 1.13-1.16 → 0.78-0.81 ms (0.5-0.6
        # alone); basic_pitch_nmp, ddddocr_common and ddddocr_common_old_dynq, whose regions run on two
        # threads too, 0.98-1.02 of their time in turns.
        let_go = self.threads > 1 and not self.alone

        def run(feeds):
            try:
                if let_go:
                    with workers_let_go():
                        return session.run(self.output_names, feeds)
                return session.run(self.output_names, feeds)
            except Exception as err:
                if not type(err).__module__.startswith("onnxruntime"):
                    raise
                raise ModelError(_failure(err, self.nodes)) from None

        self._run = run

    def _build_halves(self) -> None:
        """Two runners, one per half of a region onnxruntime refuses as a whole (each may split again)."""
        first, second = self.nodes[: len(self.nodes) // 2], self.nodes[len(self.nodes) // 2:]
        needed = set(self.output_names)
        runners = [RegionRunner(first, self.opsets, self._constants, needed | {v.name for v in region_inputs(second)},
                                self.threads, self.alone),
                   RegionRunner(second, self.opsets, self._constants, needed, self.threads, self.alone)]
        self.backend = " + ".join(sorted({b for r in runners for b in r.backend.split(" + ")}))

        def run(feeds):
            env = dict(feeds)
            for runner in runners:
                env.update(zip(runner.output_names, runner(*[env[name] for name in runner.input_names])))
            return [env[name] for name in self.output_names]

        self._run = run

    def model_proto(self, dtypes: list[ir.DataType]) -> onnx.ModelProto:
        """The region as a model of its own, its inputs of these element types and of any shape."""
        return self._model(self.nodes, dtypes, self.output_names)

    def _model(self, nodes: list[ir.Node], dtypes: list[ir.DataType], outputs: list[str]) -> onnx.ModelProto:
        inputs = [helper.make_tensor_value_info(name, int(dtype), None)  # no shapes: any batch size runs
                  for name, dtype in zip(self.input_names, dtypes)]
        initializers = [onnx.numpy_helper.from_array(np.asarray(a), name) for name, a in self._constants.items()]
        graph = helper.make_graph([ir.serde.serialize_node(n) for n in nodes], "f32_region", inputs,
                                  [onnx.ValueInfoProto(name=name) for name in outputs], initializers)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.opsets.items()])
        standard = [o for o in proto.opset_import if o.domain in ("", "ai.onnx", "ai.onnx.ml")]
        proto.ir_version = max(7, helper.find_min_ir_version_for(standard, ignore_unknown=True))
        return proto


def _failure(err: Exception, nodes: list[ir.Node]) -> str:
    """onnxruntime's error as one line naming the node (its messages hold C++ file names and signatures)."""
    text = " ".join(str(err).split())
    match = re.search(r"Name:'(.*?)' Status Message: (.*)", text)
    name, why = (match[1], match[2]) if match else (nodes[0].name if len(nodes) == 1 else None, text)
    op = next((n.op_type for n in nodes if n.name == name), None)
    where = f"node {name!r}" + (f" ({op})" if op else "") if name is not None else f"a region of {len(nodes)} nodes"
    allocation = re.search(r"Failed to allocate memory for requested buffer of size (\d+)", why)
    if allocation:
        return f"{where}: onnxruntime could not allocate {size_text(int(allocation[1]))} for it"
    why = re.sub(r"^\S+\.(cc|h):\d+ .*?\) ", "", why)  # "/onnxruntime_src/...cc:360 void* f(args) "
    return f"{where}: onnxruntime failed: {why[:300]}"


def _session(proto: onnx.ModelProto, threads: int, alone: bool, spin_while_running: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    # more threads than cores gain nothing, and many thousands exhaust the machine
    options.intra_op_num_threads = min(threads, limits.cores())
    options.inter_op_num_threads = 1
    # Idle onnxruntime threads spin by default, and would steal the cores the int8 kernels' threads
    # run on between two regions. Spinning only within a run and stopping when it returns
    # (force_spinning_stop) in every region was measured too: 0.95-0.97x on ddddocr_common,
    # silero_vad_16k_op15 and basic_pitch_nmp, but 1.22-1.57x on ddddocr_common_old_dynq's 60 small
    # regions; a recurrent one spins so (RECURRENT_OPS). A plan that is all onnxruntime spins as a plain
    # session does (silero_vad's one region, in onnxruntime alone: 0.14 ms spinning, 0.17-0.19 with
    # sleeping threads).
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if alone or spin_while_running else "0")
    if spin_while_running:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
