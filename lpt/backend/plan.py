"""compile(graph) → Plan; Plan.run(feeds) is a short loop over prepared steps.

Compiling resolves each node (or fused chain of nodes) to a step once: int8 kernels with
their weights packed and compensation precomputed (lpt.backend.int8_steps), or the fallback
runner for ops with no int8 kernel. Intermediate buffers are dropped after their last use.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
import onnx_ir as ir

from lpt.backend.fallback import NodeRunner
from lpt.errors import DataError
from lpt.graph.constants import const_array

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """One call in the plan: `run(*inputs) -> outputs`, for the nodes it covers."""

    run: Callable[..., list[np.ndarray]]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    backend: str  # "int8 kernel", "onnxruntime" or "onnx reference"


@dataclass
class Plan:
    steps: list[Step]
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, np.ndarray]
    _last_use: dict[str, int] = field(default_factory=dict)

    def __post_init__(self):
        for index, step in enumerate(self.steps):
            for name in step.inputs:
                self._last_use[name] = index

    def run(self, feeds: dict[str, np.ndarray], keep: bool = False) -> dict[str, np.ndarray]:
        """Outputs by name; with `keep`, every intermediate tensor too (for per-layer checks)."""
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise DataError(f"missing input(s) {missing}; the model expects {self.inputs}")
        env = {**self.constants, **{n: feeds[n] for n in self.inputs}}
        outputs = set(self.outputs)
        for index, step in enumerate(self.steps):
            results = step.run(*[env[n] for n in step.inputs])
            env.update(zip(step.outputs, results))
            if not keep:
                for name in step.inputs:
                    if self._last_use.get(name) == index and name not in outputs and name not in self.constants:
                        del env[name]
        return env if keep else {n: env[n] for n in self.outputs}

    def backend_counts(self) -> Counter:
        """How many nodes ran on each backend: the int8/f32 split a run reports."""
        counts = Counter()
        for step in self.steps:
            counts[step.backend] += len(step.nodes)
        return counts

    def fallback_ops(self) -> Counter:
        return Counter(op for s in self.steps if s.backend != "int8 kernel" for op in s.op_types)


def _typed(model: ir.Model) -> ir.Model:
    """A copy with every value's type inferred (the fallback sessions declare input types)."""
    from lpt.model_io import to_proto

    proto = onnx.shape_inference.infer_shapes(to_proto(model))
    return ir.serde.deserialize_model(proto)


def compile_model(model: ir.Model, threads: int = 0) -> Plan:
    """Resolve every node of `model` to a step; fuse the int8 chains lpt has kernels for.

    `threads` is the thread count of the integer GEMM and of the onnxruntime fallback (0: one per core).

    Joins (an Add or Concat of dequantized branches) are matched first, since they reach back
    over both branches; then every other node in order. A fused step runs where its last node
    stood: every input of the group is ready by then, in any topological order.
    """
    from lpt.backend.int8_steps import try_int8_step, try_join_step
    from lpt.backend.onnx_int8_steps import try_onnx_int8_step

    model = _typed(model)
    graph = model.graph
    opsets = dict(model.opset_imports)
    constants = {name: value.const_value.numpy() for name, value in graph.initializers.items()}
    position = {id(node): i for i, node in enumerate(graph)}
    placed: list[tuple[int, Step]] = []
    claimed: set[int] = set()

    def place(step: Step, nodes: list[ir.Node]) -> None:
        claimed.update(id(n) for n in nodes)
        placed.append((max(position[id(n)] for n in nodes), step))

    for node in graph:
        fused = try_join_step(node)
        if fused is not None and not any(id(n) in claimed for n in fused[1]):
            place(*fused)
    for node in graph:
        if id(node) in claimed:
            continue
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            constants[node.outputs[0].name] = const_array(node.outputs[0])  # folded: no step at run time
            continue
        fused = try_int8_step(node, threads) or try_onnx_int8_step(node)
        if fused is not None and not any(id(n) in claimed for n in fused[1]):
            place(*fused)
            continue
        runner = NodeRunner(node, opsets, threads)
        place(Step(runner, tuple(runner.input_names), tuple(runner.output_names),
                   (node.name,), (node.op_type,), runner.backend), [node])
    steps = [step for _, step in sorted(placed, key=lambda item: item[0])]
    plan = Plan(steps, [v.name for v in graph.inputs if v.name not in constants],
                [v.name for v in graph.outputs], constants)
    logger.info("compiled %d steps: %s", len(steps), dict(plan.backend_counts()))
    return plan
