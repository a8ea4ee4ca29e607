"""Reading and adding constant tensors (initializers and Constant nodes alike)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's contents when it is an initializer or a Constant node's output, else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def add_constant(graph: ir.Graph, name: str, array) -> ir.Value:
    """Register `array` as an initializer of `graph` under a name no other initializer has."""
    unique, i = name, 1
    while unique in graph.initializers:
        unique, i = f"{name}.{i}", i + 1
    array = np.asarray(array)
    value = ir.Value(
        name=unique,
        shape=ir.Shape(array.shape),
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        const_value=ir.Tensor(array, name=unique),  # ir.tensor() is ~6x slower per call
    )
    graph.register_initializer(value)
    return value
