"""lpt's int8 backend: compile a transformed graph once into a plan, run it many times."""

from lpt.backend.plan import Plan, Step, compile_model

__all__ = ["Plan", "Step", "compile_model"]
