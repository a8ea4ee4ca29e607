"""Consecutive steps the native engine can run, fused into one call (lpt.native.program).

Each step of a plan is a Python call, and between two int8 layers of a small model Python costs
more than the layers (digits_cnn: about 0.03 ms per step against a few microseconds of work).
Every maximal run of at least two steps that have a native instruction (Step.native: int8 layers
on the native engine, quantizes, joins, max pools, flattens, products, and the float32 ops between
layers of lpt.backend.float_steps) becomes one step that
runs them in one call, on buffers the engine keeps between runs; so does a lone quantize, join,
max pool or mean, which the engine computes faster than its step does.

The steps it replaces stay in the plan (Plan.steps): per-layer checks run those one by one
(Plan.run(keep=True)), and so does a fused step whose program meets an input it does not take
(lpt.native.Unsupported: a float tensor where it expects integers, say), from then on.
"""

from __future__ import annotations

import logging

import numpy as np

from lpt.backend.step import Step
from lpt.native.operations import Unsupported

logger = logging.getLogger(__name__)

ENGINE = "native program"
# Instructions worth a program of their own: their steps run numpy or lpt's C kernels in passes the
# engine does in one (a quantize of a model's input alone: 0.28 against 0.13 ms for 108k values).
# A layer's or a product's step already runs on the engine; a flatten is a reshape. A dynamic layer's step
# computes its output stage in numpy passes.
_ON_ITS_OWN = ("quantize", "join", "max_pool", "mean", "dynamic_layer")


def fuse(steps: list[Step], plan_outputs: list[str], threads: int, constants: dict[str, np.ndarray]) -> list[Step]:
    """`steps` with each run of native steps replaced by one step; the same steps where the engine is missing.
    The plan's `constants` a program reads are given to it once, and are not its step's inputs."""
    from lpt import native
    from lpt.native.program import Program

    if not native.available():
        return steps
    last_read = {name: index for index, step in enumerate(steps) for name in step.inputs}
    fused, run, first = [], [], 0
    for index, step in enumerate(steps + [None]):
        if step is not None and step.native is not None:
            if not run:
                first = index
            run.append(step)
            continue
        # identities alone pass their arrays on in Python: a program of silero_vad's two output Identities cost
        # 9 µs a run, a call into the engine for nothing
        if any(part.native[0] != "identity" for part in run) and (len(run) >= 2 or run[0].native[0] in _ON_ITS_OWN):
            made = {name for part in run for name in part.outputs}
            reads = list(dict.fromkeys(name for part in run for name in part.inputs if name not in made))
            inputs = [name for name in reads if name not in constants]
            needed = [name for part in run for name in part.outputs
                      if name in plan_outputs or last_read.get(name, -1) >= first + len(run)]
            instructions = [(part.native[0], list(part.inputs), part.outputs[0], part.native[1]) for part in run]
            try:
                program = Program(instructions, inputs, needed, threads,
                                  {name: constants[name] for name in reads if name in constants})
            except (Unsupported, ValueError) as why:
                logger.info("steps %s..%s stay separate: %s", run[0].nodes[0], run[-1].nodes[-1], why)
                fused.extend(run)
            else:
                fused.append(_program_step(program, run))
        else:
            fused.extend(run)
        run = []
        if step is not None:
            fused.append(step)
    return fused


class ProgramRun:
    """A fused step's run: the program, or its steps one by one once the program gave way."""

    def __init__(self, program, parts: list[Step]):
        self.program, self.parts, self.native = program, parts, True

    def __call__(self, *arrays):
        if self.native:
            try:
                return self.program(*arrays)
            except Unsupported as why:
                logger.info("the native program of %s..%s gives way to its steps: %s", self.parts[0].nodes[0],
                            self.parts[-1].nodes[-1], why)
                self.native = False
        env = {**self.program.constants, **dict(zip(self.program.inputs, arrays))}
        for part in self.parts:
            env.update(zip(part.outputs, part.run(*[env[name] for name in part.inputs])))
        return [env[name] for name in self.program.outputs]

    def instruction_seconds(self) -> list[tuple[Step, float]]:
        """Each step's instruction and its time in the last native run (empty once the steps run instead)."""
        return list(zip(self.parts, self.program.seconds())) if self.native else []


def _program_step(program, parts: list[Step]) -> Step:
    return Step(ProgramRun(program, parts), tuple(program.inputs), tuple(program.outputs),
                tuple(n for p in parts for n in p.nodes), tuple(t for p in parts for t in p.op_types), "int8 kernel",
                None, ENGINE)
