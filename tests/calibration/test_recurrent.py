"""Static int8 LSTM/GRU (lpt.calibration.recurrent): the Scan form computes the op's function, its
recurrent MatMuls get FQs with h's calibrated range, and lpt's backend runs the body's integers itself."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import lpt
from cli.main import main
from lpt.calibration import calibrate
from lpt.calibration.recurrent import to_scans
from lpt.pipeline import quantize
from tests.graphs import model, run_ort

HIDDEN, INPUTS, STEPS = 8, 6, 9


def recurrent_model(op: str, direction: str = "forward", *, initial: bool = True, opset: int = 17, seed: int = 0,
                    **attributes) -> tuple[onnx.ModelProto, dict]:
    """X [T, 2, I] → LSTM/GRU (trained-like weights) → Y, Y_h (and Y_c), each read by an Identity."""
    rng = np.random.default_rng(seed)
    directions, gates = (2 if direction == "bidirectional" else 1), (4 if op == "LSTM" else 3)
    weights = {name: rng.normal(0, 0.5, shape).astype(np.float32) for name, shape in
               (("W", (directions, gates * HIDDEN, INPUTS)), ("R", (directions, gates * HIDDEN, HIDDEN)),
                ("B", (directions, 2 * gates * HIDDEN)))}
    inputs = {"X": ["T", 2, INPUTS]}
    feeds = {"X": rng.normal(0, 1, (STEPS, 2, INPUTS)).astype(np.float32)}
    for state in (("h0", "c0") if op == "LSTM" else ("h0",)) if initial else ():
        inputs[state] = [directions, 2, HIDDEN]
        feeds[state] = rng.uniform(-0.5, 0.5, (directions, 2, HIDDEN)).astype(np.float32)
    outputs = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    if op == "GRU":
        attributes.setdefault("linear_before_reset", 1)
    nodes = [helper.make_node(op, ["X", "W", "R", "B", "", *[name for name in inputs if name != "X"]], [f"{o}_raw" for o in outputs],
                              name="rnn", hidden_size=HIDDEN, direction=direction, **attributes)]
    nodes += [helper.make_node("Identity", [f"{o}_raw"], [o]) for o in outputs]
    return model(nodes, inputs, {o: [None] * (4 if o == "Y" else 3) for o in outputs}, weights, opset=opset), feeds




def samples(model_feeds: dict, count: int = 6) -> list[dict]:
    rng = np.random.default_rng(7)
    return [{name: (rng.normal(0, 1, value.shape) if name == "X" else rng.uniform(-0.5, 0.5, value.shape))
             .astype(np.float32) for name, value in model_feeds.items()} for _ in range(count)]


def axes(feeds: dict) -> dict:
    """X [T, N, I] and the states [D, N, H] hold the samples on axis 1."""
    return {name: 1 for name in feeds}


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("initial, opset", [(True, 17), (False, 11)])
def test_the_scan_form_computes_the_ops_function(op, direction, initial, opset):
    proto, feeds = recurrent_model(op, direction, initial=initial, opset=opset)
    model = ir.serde.deserialize_model(proto)
    scans, left = to_scans(model)
    assert not left and len(scans) == (2 if direction == "bidirectional" else 1)
    rewritten = ir.serde.serialize_model(model)
    onnx.checker.check_model(rewritten)
    assert not [n for n in rewritten.graph.node if n.op_type == op]
    for expected, got in zip(run_ort(proto, feeds), run_ort(rewritten, feeds)):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("op, attributes, why", [
    ("GRU", {"linear_before_reset": 0}, "linear_before_reset=0"),
    ("LSTM", {"clip": 3.0}, "clip"),
    ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}, "not the default"),
])
def test_what_the_scan_form_does_not_take_stays_an_op_with_its_reason(op, attributes, why):
    proto, feeds = recurrent_model(op, **attributes)
    result = calibrate(ir.serde.deserialize_model(proto), samples(feeds), int8_recurrent=True, batch_axes=axes(feeds),
                       quiet=True, overflow_fix="none")
    [left] = [s for s in result.report.left_f32 if s.node == "rnn"]
    assert why in left.reason and not result.report.recurrent
    assert [n.op_type for n in result.model.graph if n.op_type in ("LSTM", "GRU")] == [op]


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_int8_recurrence_quantizes_h_with_the_states_range_and_runs_on_lpts_integers(op):
    """The FQ model (onnxruntime, its graph optimizations off: on, it fuses a body's QDQ MatMul into its
    u8·s8 kernel, which saturates pair sums on CPUs without VNNI) and lpt's plan of the int8 graph compute
    the same function, h·Rᵀ from lpt's exact integers, to float32 rounding; without the option the op
    stays f32."""
    proto, feeds = recurrent_model(op, "bidirectional")
    data = samples(feeds)
    plain = quantize(ir.serde.deserialize_model(proto), data, batch_axes=axes(feeds), overflow_fix="none")
    assert [n.op_type for n in plain.fq_model.graph if n.op_type in ("LSTM", "GRU", "Scan")] == [op]
    result = quantize(ir.serde.deserialize_model(proto), data, int8_recurrent=True, batch_axes=axes(feeds),
                      overflow_fix="none")
    recurrent = result.report.calibration.recurrent
    assert [r.scan for r in recurrent] == ["rnn/direction0/Scan", "rnn/direction1/Scan"]
    for r in recurrent:  # h = o·tanh(c), or a blend of tanh values and h₀ (within ±0.5): inside (−1, 1)
        assert -1 < r.hidden_low < -0.2 and 0.2 < r.hidden_high < 1
    fq_proto = lpt.model_io.to_proto(lpt.export.portable.to_portable(result.fq_model))
    bodies = [a.g for n in fq_proto.graph.node if n.op_type == "Scan" for a in n.attribute if a.name == "body"]
    assert len(bodies) == 2
    for body in bodies:
        ops = [n.op_type for n in body.node]
        assert ops.count("QuantizeLinear") == 1  # one h, read by every gate's MatMul
        assert ops.count("DequantizeLinear") == 1 + (4 if op == "LSTM" else 3)
    fq_outputs = run_ort(fq_proto, feeds)
    scan_steps = [s for s in result.plan.steps if s.op_types == ("Scan",)]
    assert len(scan_steps) == 2 and all(s.backend == "int8 kernel" for s in scan_steps)
    ours = result.plan.run(feeds)
    for name, theirs in zip([o.name for o in fq_proto.graph.output], fq_outputs):
        np.testing.assert_allclose(ours[name], theirs, atol=2e-5)
    fp32 = run_ort(proto, feeds)
    error = max(np.abs(a - b).max() for a, b in zip(fp32, fq_outputs))
    assert 1e-4 < error < 0.1  # quantized, and close


def test_the_int8_recurrence_with_numpys_kernels_is_the_native_ones():
    proto, feeds = recurrent_model("GRU", "reverse")
    result = quantize(ir.serde.deserialize_model(proto), samples(feeds), int8_recurrent=True, batch_axes=axes(feeds),
                      overflow_fix="none")
    reference = lpt.compile_model(lpt.clone(result.int8_model), native=False).run(feeds)
    ours = result.plan.run(feeds)
    for name in ("Y", "Y_h"):
        np.testing.assert_allclose(ours[name], reference[name], atol=1e-6)


def test_the_cli_option_and_combinations_it_refuses(tmp_path):
    proto, feeds = recurrent_model("GRU", initial=False)
    path = tmp_path / "gru.onnx"
    path.write_bytes(proto.SerializeToString())
    np.savez(tmp_path / "gru.npz", X=np.concatenate([s["X"] for s in samples(feeds)], axis=1))
    result = CliRunner().invoke(main, ["quantize", str(path), "--int8-recurrent", "--batch-axis", "X=1",
                                       "--overflow-fix", "none"])
    assert result.exit_code == 0, result.output
    assert "int8 recurrence: rnn (GRU) as rnn/direction0/Scan" in result.output
    assert any(n.op_type == "Scan" for n in onnx.load(tmp_path / "gru.fq.onnx").graph.node)
    refused = CliRunner().invoke(main, ["quantize", str(path), "--int8-recurrent", "--batch-axis", "X=1",
                                        "--min-sqnr", "30", "--force"])
    assert refused.exit_code != 0 and "--int8-recurrent cannot be combined" in refused.output
    assert "Traceback" not in refused.output
    kept = CliRunner().invoke(main, ["quantize", str(path), "--no-int8-recurrent", "--batch-axis", "X=1",
                                     "--overflow-fix", "none", "--force"])
    assert kept.exit_code == 0, kept.output
    assert not any(n.op_type == "Scan" for n in onnx.load(tmp_path / "gru.fq.onnx").graph.node)


@pytest.mark.parametrize("auto_hidden, taken", [(HIDDEN, True), (HIDDEN + 1, False)])
def test_by_default_recurrences_of_the_hidden_size_auto_takes_are_int8(monkeypatch, auto_hidden, taken):
    """Unless told, the LSTM/GRU of hidden size AUTO_HIDDEN or more take the Scan form (here the bound is moved to
    the test model's size, 8); a smaller one stays an op, the report saying why; int8_recurrent=False keeps every
    one f32, and so does accuracy control."""
    monkeypatch.setattr(lpt.calibration, "AUTO_HIDDEN", auto_hidden)
    proto, feeds = recurrent_model("LSTM", initial=False)
    result = calibrate(ir.serde.deserialize_model(proto), samples(feeds), batch_axes=axes(feeds), quiet=True,
                       overflow_fix="none")
    assert [n.op_type for n in result.model.graph if n.op_type in ("LSTM", "Scan")] == (["Scan"] if taken else ["LSTM"])
    why = [s.reason for s in result.report.left_f32 if s.node == "rnn"]
    assert why == ([] if taken else [f"recurrence left f32: hidden size {HIDDEN}, below {auto_hidden}: int8 pays "
                                     "where the recurrent products are larger (--int8-recurrent quantizes it)"])
    off = calibrate(ir.serde.deserialize_model(proto), samples(feeds), batch_axes=axes(feeds), quiet=True,
                    overflow_fix="none", int8_recurrent=False)
    assert [n.op_type for n in off.model.graph if n.op_type in ("LSTM", "Scan")] == ["LSTM"]
    # accuracy control reverts FQs on the fp32 model, which has no Scan form: auto takes none there (and its
    # latency, on a batch of the two samples X's given batch axis fixes, is measured)
    controlled = quantize(ir.serde.deserialize_model(proto), samples(feeds), batch_axes=axes(feeds), min_sqnr=10,
                          overflow_fix="none")
    assert [n.op_type for n in controlled.fq_model.graph if n.op_type in ("LSTM", "Scan")] == ["LSTM"]
    assert controlled.report.accuracy_control.latency_ms["before"] > 0


@pytest.mark.parametrize("overflow_fix, largest", [("all", 63), ("none", 127)])
def test_overflow_fix_all_puts_the_recurrent_weights_on_7_bits_too(overflow_fix, largest):
    proto, feeds = recurrent_model("GRU")
    result = calibrate(ir.serde.deserialize_model(proto), samples(feeds), int8_recurrent=True, batch_axes=axes(feeds),
                       quiet=True, overflow_fix=overflow_fix)
    fq_proto = lpt.model_io.to_proto(lpt.export.portable.to_portable(result.model))
    [body] = [a.g for n in fq_proto.graph.node if n.op_type == "Scan" for a in n.attribute if a.name == "body"]
    weights = [numpy_helper.to_array(i) for i in body.initializer if i.data_type == TensorProto.INT8 and len(i.dims) == 2]
    assert len(weights) == 3 and max(int(np.abs(w).max()) for w in weights) == largest
