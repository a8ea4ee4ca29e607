"""An onnxruntime region whose Ifs its inputs' shapes decide, compiled for each set of shapes it meets.

silero_vad's decoder region (its LSTM cell inside If(state.shape[1] != 0, …), Ifs on its input's rank within)
took 100-112 µs a run in onnxruntime, 55 of them onnxruntime's LSTM op alone, for a few µs of arithmetic. For
the shapes of one run lpt.graph.specialize computes what they decide and inlines the branches taken, the LSTM
is written as its cells' ops (lpt.graph.lstm_cell), and the straight line left compiles into a plan of lpt's
steps, native where they can be. Each set of input shapes is compiled once, at its first run (a few tens of
ms), up to SPECIALIZED sets; a region that does not come out free of Ifs, or whose plan holds no step of lpt's,
runs as before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from lpt.backend.fallback import RegionRunner
from lpt.graph.lstm_cell import unroll_lstms
from lpt.graph.specialize import specialize

if TYPE_CHECKING:
    from lpt.backend.plan import Plan

logger = logging.getLogger(__name__)

# Sets of input shapes compiled per region. Past them, new shapes run the region as it is: a region fed ever new
# shapes (a variable length) would otherwise pay a compilation (tens of ms) at almost every run.
SPECIALIZED = 8


class SpecializedRegion:
    """`runner`'s region, run by a plan compiled for its inputs' shapes (see the module doc). `plans` holds, per
    set of shapes, the plan or, where none came out better, the runner; and what runs it, as reports name it."""

    def __init__(self, runner: RegionRunner, threads: int):
        self.runner, self.threads = runner, threads
        self.input_names, self.output_names = runner.input_names, runner.output_names
        self.plans: dict[tuple, tuple[Plan | RegionRunner, str]] = {}
        self.shapes_decide = True  # False once an If stays for some shapes: its condition reads values
        self.ran_on = runner.backend  # the last run's backends, as Plan.backend_counts reports them

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        arrays = [np.asarray(a) for a in arrays]
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        found = self.plans.get(key)
        if found is None:
            if not self.shapes_decide or len(self.plans) >= SPECIALIZED:
                self.ran_on = self.runner.backend
                return self.runner(*arrays)
            # (plans may run in several threads at once: two may compile the same shapes, one of them kept)
            found = self.plans[key] = self._compile(arrays)
        plan, self.ran_on = found
        if plan is self.runner:
            return self.runner(*arrays)
        results = plan.run(dict(zip(self.input_names, arrays)))
        return [results[name] for name in self.output_names]

    def _compile(self, arrays: list[np.ndarray]) -> tuple[Plan | RegionRunner, str]:
        from lpt.backend.plan import compile_model  # here: lpt.backend.plan imports this module

        as_before = (self.runner, self.runner.backend)
        proto = self.runner.model_proto([ir.DataType.from_numpy(a.dtype) for a in arrays])
        specialized = specialize(proto, {name: a.shape for name, a in zip(self.input_names, arrays)})
        if specialized is None or any(node.op_type == "If" for node in specialized.graph.node):
            self.shapes_decide = False
            return as_before
        specialized, _ = unroll_lstms(specialized)
        try:
            plan = compile_model(ir.serde.deserialize_model(specialized), threads=self.threads, inputs_from_lpt=True,
                                 small_products=True)
        except Exception as why:  # noqa: BLE001 - whatever stops it compiling, the region runs as before
            logger.info("a region for shapes %s runs as a whole: %s", [a.shape for a in arrays], why)
            return as_before
        backends = {step.backend for step in plan.steps}
        if backends == {"onnxruntime"}:
            return as_before  # no step of lpt's: the Ifs gone, but the session call stays
        return plan, " + ".join(sorted(backends))
