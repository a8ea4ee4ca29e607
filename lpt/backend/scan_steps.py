"""A Scan whose body holds integer ops runs on lpt's backend: its body compiled once as a plan,
and where that plan is one native program, the whole Scan is one call of the engine
(Program.scan), else the body is called once per step.

onnxruntime would run such a body with its own integer kernels, which on CPUs without VNNI add
pairs of u8·s8 products in a saturating int16 (lpt.backend.emulation); lpt's quantized LSTM/GRU
(lpt.calibration.recurrent) are Scans of this kind. The body's plan puts its int8 chains on lpt's
exact kernels and its f32 ops (the gates) on lpt's float steps or in onnxruntime regions, as any plan
does. As one call, ddddocr_common's int8 LSTM (hidden 512, 32 steps) took 0.59 ms a direction instead of
0.93 with a call per step (a Xeon with AMX, 2 threads).

Taken: Scan (opset 9+: no batch axis) whose body reads no value of the outer graph, with scan
axes 0. Others run whole in onnxruntime.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_ir as ir

from lpt.backend.fallback import region_inputs
from lpt.backend.native_program import ProgramRun
from lpt.backend.step import Step
from lpt.errors import DataError
from lpt.graph.ops import QUANTIZED_OPS
from lpt.native import Unsupported
from lpt.native.program import Program

logger = logging.getLogger(__name__)


def try_scan_step(node: ir.Node, opsets: dict[str, int], threads: int, native: bool, emulate=None):
    """(Step, [node]) for a Scan whose body computes on integers, else None."""
    if node.op_type != "Scan" or node.domain not in ("", "ai.onnx") or opsets.get("", 1) < 9:
        return None
    body = node.attributes["body"].value
    if not any(n.op_type in QUANTIZED_OPS for n in body):
        return None
    if set(region_inputs([node])) != {v for v in node.inputs if v is not None}:
        return None  # the body reads outer-scope values
    scan_inputs = node.attributes["num_scan_inputs"].as_int()
    states = len(node.inputs) - scan_inputs
    attribute = {name: list(node.attributes[name].as_ints()) if name in node.attributes else []
                 for name in ("scan_input_directions", "scan_output_directions", "scan_input_axes", "scan_output_axes")}
    if any(attribute["scan_input_axes"]) or any(attribute["scan_output_axes"]):
        return None
    from lpt.backend.plan import compile_model  # here: lpt.backend.plan imports this module

    standalone = _standalone(body, opsets)

    def compile_body(threads: int):
        # a copy each time: compiling types the model's values in place
        copy = ir.serde.deserialize_model(ir.serde.serialize_model(standalone))
        return compile_model(copy, threads=threads, native=native, emulate=emulate)

    backwards_in = [bool(d) for d in attribute["scan_input_directions"]] or [False] * scan_inputs
    backwards_out = [bool(d) for d in attribute["scan_output_directions"]] or [False] * (len(body.outputs) - states)
    run = ScanRun(node.name, compile_body, threads, [v.name for v in body.inputs], states, backwards_in, backwards_out)
    step = Step(run, tuple(v.name for v in node.inputs), tuple(v.name for v in node.outputs), (node.name,),
                (node.op_type,), "int8 kernel")
    return step, [node]


class ScanRun:
    """A Scan step's run: in one native call where the body is one program (`whole`), else one call of the
    body per time step, in Python; the same bits either way."""

    def __init__(self, name: str, compile_body, threads: int, names: list[str], states: int,
                 backwards_in: list[bool], backwards_out: list[bool]):
        self.name, self.states, self.backwards_in, self.backwards_out = name, states, backwards_in, backwards_out
        self._compile_body, self._names = compile_body, names
        plan = compile_body(threads)
        self.call = _one_call(plan, names)
        self.whole = _whole_scan(plan, names, states, backwards_in, backwards_out)

    def on_one_thread(self) -> ScanRun:
        """The same Scan with its body compiled for one thread (to run beside others: ScansAtOnce)."""
        return ScanRun(self.name, self._compile_body, 1, self._names, self.states, self.backwards_in,
                       self.backwards_out)

    def length(self, inputs) -> int:
        """The length of the Scan's sequences (DataError where they differ, or are empty)."""
        lengths = sorted({sequence.shape[0] for sequence in inputs[self.states:]})
        if len(lengths) > 1:
            raise DataError(f"{self.name}: Scan over sequences of different lengths {lengths}")
        if lengths[0] == 0:
            raise DataError(f"{self.name}: Scan over a sequence of length 0")
        return lengths[0]

    def __call__(self, *inputs):
        state, sequences = list(inputs[:self.states]), inputs[self.states:]
        length = self.length(inputs)
        if self.whole is not None and self.whole.native:
            try:
                return self.whole(inputs)
            except Unsupported as why:
                logger.info("%s: its Scan runs step by step: %s", self.name, why)
                self.whole.native = False
        emitted = [[None] * length for _ in self.backwards_out]
        for t in range(length):
            steps_in = [sequence[length - 1 - t if backwards else t]
                        for sequence, backwards in zip(sequences, self.backwards_in)]
            outputs = self.call(state + steps_in)
            state = outputs[:self.states]
            for k, (value, backwards) in enumerate(zip(outputs[self.states:], self.backwards_out)):
                emitted[k][length - 1 - t if backwards else t] = value
        return [*state, *(np.stack(values) for values in emitted)]


class ScansAtOnce:
    """Independent Scans (a bidirectional LSTM's two directions), each in one native call on a thread of its
    own (Program.scans), their bodies compiled for one thread; each Scan's own run where one gives way.
    ddddocr_common's int8 LSTM (hidden 512, 32 steps) took 0.52 ms so, against 0.98 for its directions one
    after the other on two threads (a Xeon with AMX): a 1 × 512 by [512, 512] gains little from a second
    thread, and the weights of one direction stay in one core's L2."""

    def __init__(self, runs: list[ScanRun], reads: list[list[int]], threads: int):
        self.runs, self.reads, self.threads = runs, reads, threads

    def __call__(self, *arrays):
        inputs = [[arrays[i] for i in reads] for reads in self.reads]
        for run, own in zip(self.runs, inputs):
            run.length(own)
        if all(run.whole is not None and run.whole.native for run in self.runs):
            try:
                results = Program.scans([(run.whole.body.program, run.whole.arrays(own), run.whole.roles,
                                          run.whole.emits) for run, own in zip(self.runs, inputs)], self.threads)
            except Unsupported as why:
                logger.info("Scans %s run one after the other: %s", ", ".join(r.name for r in self.runs), why)
            else:
                return [value for run, outputs in zip(self.runs, results) for value in run.whole.ordered(outputs)]
        return [value for run, own in zip(self.runs, inputs) for value in run(*own)]


def scans_at_once(steps: list[Step], threads: int) -> list[Step]:
    """`steps` with each group of consecutive Scan steps that run in one native call, none reading another's
    outputs, as one step that runs them at once (ScansAtOnce), at most `threads` to a group."""
    if threads < 2:
        return steps
    grouped, group = [], []

    def close():
        if len(group) > 1:
            grouped.append(_at_once(group))
        else:
            grouped.extend(group)
        group.clear()

    for step in steps:
        alone = not (isinstance(step.run, ScanRun) and step.run.whole is not None)
        if alone or len(group) == threads or any(set(step.inputs) & set(other.outputs) for other in group):
            close()
        (grouped.append if alone else group.append)(step)
    close()
    return grouped


def _at_once(group: list[Step]) -> Step:
    names = list(dict.fromkeys(name for step in group for name in step.inputs))
    runs = [step.run.on_one_thread() for step in group]
    return Step(ScansAtOnce(runs, [[names.index(n) for n in step.inputs] for step in group], len(group)), tuple(names),
                tuple(n for step in group for n in step.outputs), tuple(n for step in group for n in step.nodes),
                tuple(t for step in group for t in step.op_types), "int8 kernel")


def _single_step(plan, names: list[str]):
    """(the plan's one step, the index of each body output among the step's) where the body compiled to one (a
    native program) reading only the body's inputs `names` and constants and giving the body's outputs (in any
    order), else (None, None)."""
    if len(plan.run_steps) != 1:
        return None, None
    [only] = plan.run_steps
    if not set(only.inputs) <= set(names) | set(plan.constants) or sorted(only.outputs) != sorted(plan.outputs):
        return None, None
    return only, [list(only.outputs).index(name) for name in plan.outputs]


def _one_call(plan, names: list[str]):
    """body inputs (in the body's order) → body outputs: the plan's one step called directly where the
    body compiled to one (_single_step), which spares each time step the plan's bookkeeping."""
    only, outputs = _single_step(plan, names)
    if only is not None:
        fixed = [plan.constants.get(name) for name in only.inputs]
        order = [names.index(name) if name in names else None for name in only.inputs]

        def directly(values):
            results = only.run(*[fixed[k] if i is None else values[i] for k, i in enumerate(order)])
            return [results[k] for k in outputs]
        return directly

    def through_the_plan(values):
        results = plan.run(dict(zip(names, values)))
        return [results[name] for name in plan.outputs]
    return through_the_plan


class _WholeScan:
    """The Scan in one call of its body's native program (Program.scan): no Python between time steps."""

    def __init__(self, body: ProgramRun, fixed: list, roles: list[int], emits: list[int], order: list[int]):
        self.body, self.fixed, self.roles, self.emits, self.order = body, fixed, roles, emits, order
        self._native = True

    @property
    def native(self) -> bool:  # false once the body's program gave way to its steps, or a scan did
        return self._native and self.body.native

    @native.setter
    def native(self, value: bool):
        self._native = value

    def arrays(self, inputs) -> list[np.ndarray]:
        """The program's inputs from the Scan's (its states, then its sequences)."""
        return [np.asarray(inputs[k] if k is not None else fixed, order="C") for k, fixed in self.fixed]

    def ordered(self, results: list[np.ndarray]) -> list[np.ndarray]:
        """The Scan's outputs from the program's."""
        return [results[k] for k in self.order]

    def __call__(self, inputs) -> list[np.ndarray]:
        return self.ordered(self.body.program.scan(self.arrays(inputs), self.roles, self.emits))


def _whole_scan(plan, names: list[str], states: int, backwards_in: list[bool], backwards_out: list[bool]):
    """A _WholeScan where the body compiled to one native program (_single_step), else None."""
    only, order = _single_step(plan, names)  # order: the body's outputs among the program's
    if only is None or not isinstance(only.run, ProgramRun):
        return None
    emits = [-1] * len(order)
    for k, backwards in enumerate(backwards_out):
        emits[order[states + k]] = int(backwards)
    fixed, roles = [], []
    for name in only.inputs:
        at = names.index(name) if name in names else None
        fixed.append((at, plan.constants[name] if at is None else None))
        roles.append(-1 if at is None else order[at] if at < states else -3 if backwards_in[at - states] else -2)
    return _WholeScan(only.run, fixed, roles, emits, order)


def _standalone(body: ir.Graph, opsets: dict[str, int]) -> ir.Model:
    """A model of its own holding a copy of `body` (which reads no outer value)."""
    graph = ir.serde.serialize_graph(body)
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    return ir.serde.deserialize_model(proto)
