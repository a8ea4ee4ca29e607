"""lpt's int8 backend: compile a transformed graph once into a plan, run it many times."""

from lpt.backend.plan import Plan, compile_model
from lpt.backend.step import Step

__all__ = ["Plan", "Step", "compile_model"]
