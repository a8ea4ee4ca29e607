"""Shape arithmetic as steps that remember their results for the shapes they measured.

Exporters compute shapes at run time:
- plcmos_v2: Shape → Gather → Unsqueeze → Concat, a Reshape's target;
- the PaddleOCR recognizer: Shape → Slice → Concat;
- ddddocr_common: Shape → Gather → Mul → Unsqueeze → Concat, the target of the Reshape before its LSTM.

Those nodes read the tensors they measure only through their shapes. Left in float32, they were an
onnxruntime region of their own between two native programs. plcmos_v2's 7 nodes took 25 µs called
again and again, but 150-250 µs right after the native program before them, as they run in a plan.

Here each set of such nodes that measures the same tensors is one step. It computes its results with
onnxruntime the first time it sees a set of shapes (and dtypes), and after that looks them up. The
results are the same: they depend on nothing else. Integer shape arithmetic has no rounding to differ.

Only where the plan has steps of its own, and only where lpt's steps, the model's inputs or constants
make the measured tensors. A tensor that onnxruntime makes is measured inside its region, which would
otherwise be cut in two. The plan (lpt.backend.plan) keeps such a step only where one of its own steps
reads the results. Where only onnxruntime's nodes read them, they stay in their region, which runs anyway.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import onnx_ir as ir

from lpt.backend.fallback import RegionRunner, region_outputs
from lpt.backend.step import Step

MEASURES = ("Shape", "Size")
BACKEND = "lpt shapes"
REMEMBERED = 8  # sets of shapes a step keeps the results of (a model fed a few sizes in turn)
# A region whose inputs are integers or booleans of at most this many values in all (a sample rate, a flag) is
# remembered by their values (by_value): silero_vad's Equal(sr, 16000) took 18 µs a run as an onnxruntime
# session call, in a plan of 0.3 ms.
SMALL_VALUES = 16
UNREPEATABLE = ("RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial")  # new values at each run


def repeatable(node: ir.Node) -> bool:
    """Whether `node` gives the same results for the same inputs: an op of the standard domain, not a random one."""
    return node.domain in ("", "ai.onnx") and node.op_type not in UNREPEATABLE


def by_small_values(nodes: list[ir.Node], inputs: list[ir.Value]) -> bool:
    """Whether a region of `nodes` reading `inputs` (besides constants) is remembered by their values: every one
    integer or boolean, of a static shape of SMALL_VALUES values in all at most, every node repeatable and
    without a subgraph."""
    small = all(v.dtype is not None and (v.dtype.is_integer() or v.dtype == ir.DataType.BOOL) and v.shape is not None
                and v.shape.is_static() for v in inputs) and \
        sum(int(np.prod(v.shape.numpy(), dtype=np.int64)) for v in inputs) <= SMALL_VALUES
    return bool(inputs) and small and all(repeatable(n) and not any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in n.attributes.values()) for n in nodes)


def shape_steps(nodes: list[ir.Node], outputs: set[str], constants: dict[str, np.ndarray],
                opsets: dict[str, int]) -> list[tuple[Step, list[ir.Node]]]:
    """Steps for the shape arithmetic among `nodes`, the plan's float32 nodes in graph order: one per connected
    set of such nodes, whose inputs are the tensors it measures (so that their shapes are all it depends on).
    None where one of those tensors is made by one of `nodes`, or after what the set computes (waiting for it
    would hold up the set's readers). `outputs` are the graph's; `constants` holds the Constant nodes' values
    too, as compile_model folds them before."""
    measured: dict[int, frozenset[str]] = {}  # id(node) → the tensors it measures, through its inputs
    producer = {id(v): n for n in nodes for v in n.outputs}
    leader: dict[int, int] = {}  # union-find over the nodes measured shapes flow through

    def find(i: int) -> int:
        while leader[i] != i:
            leader[i] = leader[leader[i]]
            i = leader[i]
        return i

    for node in nodes:
        if not repeatable(node) or any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            continue
        read = [v for v in node.inputs if v is not None]
        sources = [producer.get(id(v)) for v in read if v.name not in constants]
        if node.op_type in MEASURES and read:
            measured[id(node)] = frozenset([read[0].name])
        elif sources and all(s is not None and id(s) in measured for s in sources):
            measured[id(node)] = frozenset().union(*(measured[id(s)] for s in sources))
        else:
            continue
        leader[id(node)] = id(node)
        for source in sources if node.op_type not in MEASURES else []:
            leader[find(id(source))] = find(id(node))
    made_in_f32 = {v.name for n in nodes for v in n.outputs}
    order = {id(n): i for i, n in enumerate(nodes)}
    components: dict[int, list[ir.Node]] = {}
    for node in nodes:
        if id(node) in measured:
            components.setdefault(find(id(node)), []).append(node)
    groups: dict[frozenset[str], list[ir.Node]] = {}  # the components that measure the same tensors, as one
    for component in components.values():
        groups.setdefault(frozenset().union(*(measured[id(n)] for n in component)), []).extend(component)
    steps = []
    for roots, group in groups.items():
        group.sort(key=lambda n: order[id(n)])
        needed = region_outputs(group, outputs)
        if not needed or roots & made_in_f32 or roots & _made_after(needed, {id(n) for n in group}):
            continue
        runner = Remembered(RegionRunner(group, opsets, constants, {v.name for v in needed}))
        steps.append((Step(runner, tuple(runner.input_names), tuple(runner.output_names),
                           tuple(n.name for n in group), tuple(n.op_type for n in group), BACKEND), group))
    return steps


def _made_after(values: list[ir.Value], inside: set[int]) -> set[str]:
    """The names of the tensors computed from `values` by nodes outside `inside`, however indirectly."""
    made, seen, pending = set(), set(), list(values)
    while pending:
        for user, _ in pending.pop().uses():
            if id(user) in inside or id(user) in seen:
                continue
            seen.add(id(user))
            made.update(v.name for v in user.outputs)
            pending.extend(user.outputs)
    return made


class Remembered:
    """A region's run, remembered per set of its inputs' shapes and dtypes (the only things its nodes read of
    them), or with `by_value` per set of their values (by_value says where); the oldest set is forgotten first.
    The results it hands out are read-only: every run shares them. Plans may run in several threads at once:
    the lock keeps the memory whole as it grows."""

    def __init__(self, runner: RegionRunner, by_value: bool = False):
        self.runner, self.by_value = runner, by_value
        self.input_names, self.output_names = runner.input_names, runner.output_names
        self.results: OrderedDict[tuple, list[np.ndarray]] = OrderedDict()
        self.computed = 0  # runs of the region: what the tests count
        self.lock = threading.Lock()

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        if self.by_value:
            arrays = [np.asarray(a) for a in arrays]
            if sum(a.size for a in arrays) > SMALL_VALUES:
                return self.runner(*arrays)
            key = tuple((a.shape, a.dtype.str, a.tobytes()) for a in arrays)
        else:
            key = tuple((np.shape(a), np.asarray(a).dtype.str) for a in arrays)
        found = self.results.get(key)  # one dict read: no lock (a lookup and a move cost silero_vad's plan 4 µs)
        if found is not None:
            return found
        results = [np.asarray(r) for r in self.runner(*arrays)]
        for r in results:
            r.flags.writeable = False
        with self.lock:
            self.computed += 1
            self.results[key] = results
            if len(self.results) > REMEMBERED:
                self.results.popitem(last=False)
        return results
