"""SmoothQuant (lpt.calibration.smooth_quant) and the transformer blocks placement leaves in f32.

The models are built here with onnx.helper (fixed seeds): a LayerNorm whose γ gives one channel
an outlier, read by a MatMul; a chain that exercises every place the scale can go (LayerNorm, a
producing MatMul + bias, a constant Mul, an inserted Mul); an encoder block with a decomposed
LayerNorm and a GELU written with the ½ first.
"""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import lpt
from cli.main import main
from lpt.calibration import _working_copy, calibrate, place
from lpt.calibration.data import CalibrationData, input_specs
from lpt.calibration import smooth_quant
from lpt.calibration.smooth_quant import (LAYER_NORM, MUL, PRODUCER, SCALE, apply_smoothing, smoothed_copy,
                                          smoothing_plan)
from lpt.calibration.statistics import session, with_outputs
from lpt.errors import QuantizationError
from tests.graphs import model, run_ort

C, T = 16, 4
OUTLIER = 5  # the channel LayerNorm's γ blows up


def ln_matmul(seed: int = 0) -> onnx.ModelProto:
    """x [N, T, C] → LayerNorm (γ[OUTLIER] = 40) → MatMul [C, 8] + bias → y. The outlier channel's weight
    row is small (its contribution to y is like the others'), as for the outlier features of LLMs: one
    per-tensor activation range then leaves the other channels a few levels."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 1.5, C).astype(np.float32)
    gamma[OUTLIER] = 40.0
    w = rng.normal(0, 0.3, (C, 8)).astype(np.float32)
    w[OUTLIER] /= 40.0
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1),
             helper.make_node("MatMul", ["h", "w"], ["m"], name="fc"),
             helper.make_node("Add", ["m", "b"], ["y"], name="fc_bias")]
    inits = {"gamma": gamma, "beta": rng.normal(0, 0.1, C).astype(np.float32),
             "w": w, "b": rng.normal(0, 0.1, 8).astype(np.float32)}
    return model(nodes, {"x": ["N", T, C]}, {"y": ["N", T, 8]}, inits, opset=17)


def every_absorber(seed: int = 1) -> onnx.ModelProto:
    """LayerNorm → Identity (an exported Dropout) → fc1(+b) → fc2 → ×c → fc3 → Tanh → fc4: the scale lands in
    γ/β, fc1's columns, c and an inserted Mul."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 1.5, C).astype(np.float32)
    gamma[OUTLIER] = 30.0
    w = {f"w{i}": rng.normal(0, 0.3, (C, C)).astype(np.float32) for i in range(1, 5)}
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln_out"], name="ln", axis=-1),
             helper.make_node("Identity", ["ln_out"], ["h0"], name="dropout"),
             helper.make_node("MatMul", ["h0", "w1"], ["m1"], name="fc1"),
             helper.make_node("Add", ["m1", "b1"], ["h1"], name="fc1_bias"),
             helper.make_node("MatMul", ["h1", "w2"], ["h2"], name="fc2"),
             helper.make_node("Mul", ["h2", "half"], ["h3"], name="half"),
             helper.make_node("MatMul", ["h3", "w3"], ["h4"], name="fc3"),
             helper.make_node("Tanh", ["h4"], ["h5"], name="tanh"),
             helper.make_node("MatMul", ["h5", "w4"], ["y"], name="fc4")]
    inits = {"gamma": gamma, "beta": rng.normal(0, 0.1, C).astype(np.float32),
             "b1": rng.normal(0, 0.1, C).astype(np.float32), "half": np.float32(0.5), **w}
    return model(nodes, {"x": ["N", T, C]}, {"y": ["N", T, C]}, inits, opset=17)


def encoder_block(seed: int = 2) -> onnx.ModelProto:
    """Decomposed LayerNorm → Q, K, V → softmax(Q·Kᵀ)·V → fc1 → GELU (½·x first) → fc2."""
    rng = np.random.default_rng(seed)

    def const(name, value):
        return helper.make_node("Constant", [], [name], name=f"{name}_const",
                                value=onnx.numpy_helper.from_array(np.asarray(value, np.float32), name))

    nodes = [const("two", 2.0), const("eps", 1e-5), const("sqrt2", np.sqrt(2.0)), const("one", 1.0),
             const("halfc", 0.5),
             helper.make_node("ReduceMean", ["x"], ["mean"], name="ln/mean", axes=[-1]),
             helper.make_node("Sub", ["x", "mean"], ["centered"], name="ln/sub"),
             helper.make_node("Pow", ["centered", "two"], ["squared"], name="ln/pow"),
             helper.make_node("ReduceMean", ["squared"], ["var"], name="ln/var", axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["var_eps"], name="ln/eps"),
             helper.make_node("Sqrt", ["var_eps"], ["std"], name="ln/sqrt"),
             helper.make_node("Div", ["centered", "std"], ["normed"], name="ln/div"),
             helper.make_node("Mul", ["normed", "gamma"], ["scaled"], name="ln/gamma"),
             helper.make_node("Add", ["scaled", "beta"], ["h"], name="ln/beta")]
    for p in "qkv":
        nodes.append(helper.make_node("MatMul", ["h", f"w{p}"], [p], name=f"{p}/MatMul"))
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="attn/scores"),
              helper.make_node("Softmax", ["scores"], ["probs"], name="attn/softmax", axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["context"], name="attn/context"),
              helper.make_node("MatMul", ["context", "w1"], ["f"], name="fc1"),
              helper.make_node("Mul", ["f", "halfc"], ["f_half"], name="gelu/half"),
              helper.make_node("Div", ["f", "sqrt2"], ["f_scaled"], name="gelu/div"),
              helper.make_node("Erf", ["f_scaled"], ["erf"], name="gelu/erf"),
              helper.make_node("Add", ["erf", "one"], ["erf1"], name="gelu/add"),
              helper.make_node("Mul", ["f_half", "erf1"], ["g"], name="gelu/mul"),
              helper.make_node("MatMul", ["g", "w2"], ["y"], name="fc2")]
    inits = {"gamma": rng.uniform(0.5, 1.5, C).astype(np.float32), "beta": rng.normal(0, 0.1, C).astype(np.float32),
             **{f"w{p}": rng.normal(0, 0.3, (C, C)).astype(np.float32) for p in "qkv12"}}
    return model(nodes, {"x": ["N", T, C]}, {"y": ["N", T, C]}, inits, opset=17)


def conv_chain(seed: int = 4) -> onnx.ModelProto:
    """x [N, 3, 8, 8] → conv1 → Relu → conv2 → HardSwish → depthwise conv3 → conv4 (1×1) → y. conv1's
    channel OUTLIER is 30x the others (its row in conv2 is small): the scale lands in conv1's filters
    (through the Relu), an inserted Mul (after the HardSwish) and conv3's filters."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.3, (C, 3, 3, 3)).astype(np.float32)
    w1[OUTLIER] *= 30.0
    w2 = rng.normal(0, 0.2, (C, C, 3, 3)).astype(np.float32)
    w2[:, OUTLIER] /= 30.0
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c2"], ["h2"], name="hard_swish"),
             helper.make_node("Conv", ["h2", "w3"], ["c3"], name="conv3", group=C, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c3", "w4", "b4"], ["y"], name="conv4")]
    inits = {"w1": w1, "b1": rng.normal(0, 0.1, C).astype(np.float32), "w2": w2,
             "b2": rng.normal(0, 0.1, C).astype(np.float32), "w3": rng.normal(0, 0.3, (C, 1, 3, 3)).astype(np.float32),
             "w4": rng.normal(0, 0.3, (8, C, 1, 1)).astype(np.float32), "b4": rng.normal(0, 0.1, 8).astype(np.float32)}
    return model(nodes, {"x": ["N", 3, 8, 8]}, {"y": ["N", 8, 8, 8]}, inits, opset=17)


def images(n: int = 64, seed: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, (n, 3, 8, 8)).astype(np.float32)}


def inputs(n: int = 64, seed: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, (n, T, C)).astype(np.float32)}


def plan_of(proto, alpha: float = 0.5, samples=inputs):
    working = _working_copy(_ir(proto))
    data = CalibrationData(samples(), input_specs(working))
    return working, smoothing_plan(working, data, alpha, quiet=True)


def _ir(proto):
    import onnx_ir as ir

    return ir.serde.deserialize_model(proto)


def channel_max(m, tensor: str, feeds) -> np.ndarray:
    """max|X_j| per channel of `tensor` when `m` runs on `feeds` (onnxruntime, fp32)."""
    sess = session(with_outputs(m, [tensor]))
    x = sess.run([tensor], feeds)[0]
    return np.abs(x).reshape(-1, x.shape[-1]).max(axis=0)


# -- the fp32 function is kept, the outlier moves


@pytest.mark.parametrize("build, samples", [(ln_matmul, inputs), (every_absorber, inputs), (encoder_block, inputs),
                                            (conv_chain, images)])
def test_the_smoothed_fp32_model_computes_the_same_outputs(build, samples):
    proto = build()
    working, smoothing = plan_of(proto, samples=samples)
    assert smoothing.tensors
    smoothed = smoothed_copy(working, smoothing)
    feeds = samples(16, seed=9)  # not the calibration samples
    expected, got = run_ort(proto, feeds)[0], run_ort(smoothed, feeds)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    # and something did change: the smoothed layers read new weights
    assert sum(name.endswith("/smoothed") for name in smoothed.graph.initializers) >= len(smoothing.tensors)


def test_every_place_the_scale_can_go_is_used():
    _, smoothing = plan_of(every_absorber())
    absorbed = {t.tensor: t.absorbed_by for t in smoothing.tensors}
    assert absorbed == {"h0": LAYER_NORM, "h1": PRODUCER, "h3": SCALE, "h5": MUL}


def test_a_conv_input_is_smoothed_only_where_a_channel_dwarfs_the_rest():
    _, smoothing = plan_of(conv_chain(), samples=images)
    [r1] = smoothing.tensors  # x, h2 and c3: every channel within CONV_OUTLIER_RATIO of the median
    assert r1.tensor == "r1" and r1.absorbed_by == PRODUCER and r1.layers == ("conv2",)
    assert r1.outlier_ratio > 10 and r1.outlier_ratio_after < r1.outlier_ratio / 3
    [strong] = plan_of(conv_chain(), alpha=0.95, samples=images)[1].tensors  # a Conv's input takes at most α 0.5
    np.testing.assert_array_equal(strong.scales, r1.scales)


def test_every_place_a_convs_scale_can_go_is_used(monkeypatch):
    """Filters of a producing Conv (through a Relu, or directly: depthwise conv3), an inserted Mul (after
    the HardSwish, on the model's input), one-group and depthwise readers; the function unchanged."""
    monkeypatch.setattr(smooth_quant, "CONV_OUTLIER_RATIO", 0.0)
    proto = conv_chain()
    working, smoothing = plan_of(proto, samples=images)
    absorbed = {t.tensor: (t.absorbed_by, t.layers) for t in smoothing.tensors}
    assert absorbed == {"x": (MUL, ("conv1",)), "r1": (PRODUCER, ("conv2",)), "h2": (MUL, ("conv3",)),
                        "c3": (PRODUCER, ("conv4",))}
    feeds = images(8, seed=9)
    expected, got = run_ort(proto, feeds)[0], run_ort(smoothed_copy(working, smoothing), feeds)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_int8_sqnr_of_a_cnn_gains_from_smoothing():
    proto = conv_chain()
    test = images(32, seed=11)

    def sqnr(alpha):
        result = lpt.quantize(_ir(proto), images(), smooth_quant=alpha, overflow_fix="none")
        return result.compare(test).outputs["y"].sqnr_db

    plain, smoothed = sqnr(None), sqnr(0.5)
    assert smoothed > plain + 3, (plain, smoothed)  # measured: 17.6 → 32.4 dB


def test_the_outlier_channel_moves_into_the_weights():
    proto = ln_matmul()
    working, smoothing = plan_of(proto)
    (t,) = smoothing.tensors
    feeds = inputs(16, seed=9)
    before, after = channel_max(_ir(proto), "h", feeds), channel_max(smoothed_copy(working, smoothing), "h", feeds)
    assert before.argmax() == OUTLIER and after[OUTLIER] < before[OUTLIER] / 4
    ratio = lambda m: m.max() / np.median(m)  # noqa: E731
    assert ratio(after) < ratio(before) / 4
    assert t.outlier_ratio_after < t.outlier_ratio / 4 and t.absorbed_by == LAYER_NORM
    # s_j = max|X_j|^α / max|W_j|^(1−α), as the paper defines it
    w = onnx.numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == "w"))
    x_max = channel_max(_ir(proto), "h", inputs())
    np.testing.assert_allclose(t.scales, np.sqrt(x_max) / np.sqrt(np.abs(w).max(axis=1)), rtol=1e-5)


def test_int8_sqnr_gains_from_smoothing():
    proto = ln_matmul()
    test = inputs(64, seed=11)

    def sqnr(alpha):
        result = lpt.quantize(_ir(proto), inputs(), smooth_quant=alpha, overflow_fix="none")
        return result.compare(test).outputs["y"].sqnr_db, result

    plain, _ = sqnr(None)
    smoothed, result = sqnr(0.5)
    assert smoothed > plain + 10, (plain, smoothed)  # measured: 13.1 → 34.3 dB
    assert result.report.calibration.smooth_quant == 0.5
    assert [t["absorbed_by"] for t in result.report.calibration.smoothed] == [LAYER_NORM]


def test_applying_a_plan_to_a_fresh_copy_gives_the_same_model():
    working, smoothing = plan_of(every_absorber())
    a, b = smoothed_copy(working, smoothing), _working_copy(working)
    apply_smoothing(b, smoothing)
    feeds = inputs(4, seed=5)
    np.testing.assert_array_equal(run_ort(a, feeds)[0], run_ort(b, feeds)[0])


def test_accuracy_control_reverts_the_fqs_of_the_smoothed_model():
    """The inserted Mul moves fc4's FQ onto its output: reverting must place on the smoothed model."""
    result = lpt.quantize(_ir(every_absorber()), inputs(), smooth_quant=0.5, overflow_fix="none", min_sqnr=80,
                          eval_data=inputs(16, seed=9), max_time=60)
    control = result.report.accuracy_control
    assert control.reverted and "fc4" in {layer.name for layer in control.ranking}
    assert control.after.sqnr_db > control.before.sqnr_db


def test_alpha_outside_zero_one_is_refused():
    with pytest.raises(QuantizationError, match="smooth_quant"):
        calibrate(_ir(ln_matmul()), inputs(), smooth_quant=1.5, quiet=True)


# -- transformer blocks stay f32, the attention MatMuls run int8


def test_softmax_layer_norm_and_gelu_are_left_f32_with_the_reason():
    working = _working_copy(_ir(encoder_block()))
    reasons = {s.node: s.reason for s in place(working).skipped}
    chain = ["ln/mean", "ln/sub", "ln/pow", "ln/var", "ln/eps", "ln/sqrt", "ln/div", "ln/gamma", "ln/beta"]
    gelu = ["gelu/div", "gelu/erf", "gelu/add", "gelu/half", "gelu/mul"]
    assert all("transformer default: LayerNorm" in reasons.get(n, "") for n in chain), reasons
    assert all("transformer default: Erf-GELU" in reasons.get(n, "") for n in gelu), reasons
    assert "transformer default: Softmax" in reasons["attn/softmax"]


def test_digits_transformer_reports_its_blocks_and_runs_attention_on_int8():
    result = lpt.quantize("models/digits_transformer.onnx", "models/digits_transformer.npz", subset_size=32,
                          overflow_fix="none")
    left = {s.node: s.reason for s in result.report.calibration.left_f32}
    assert left["/Softmax"].startswith("transformer default: Softmax")
    assert left["/ln1/LayerNormalization"].startswith("transformer default: LayerNorm")
    assert left["/gelu/Erf"].startswith("transformer default: Erf-GELU")
    precision = {p.node: p.precision for p in result.report.precisions}
    assert precision["/MatMul/integer"] == precision["/MatMul_1/integer"] == "int8"  # Q·Kᵀ and attn·V


# -- the command line


def test_cli_smooth_quant_reaches_the_calibration(tmp_path):
    onnx.save(ln_matmul(), tmp_path / "net.onnx")
    np.savez(tmp_path / "net.npz", **inputs())
    result = CliRunner().invoke(main, ["quantize", str(tmp_path / "net.onnx"), "--smooth-quant", "0.5",
                                       "--json", str(tmp_path / "r.json"), "--quiet"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())["calibration"]
    assert report["smooth_quant"] == 0.5 and report["smoothed"][0]["absorbed_by"] == LAYER_NORM
    assert "smooth quant (alpha 0.5): 1 activations smoothed" in result.output
    fq = onnx.load(tmp_path / "net.fq.onnx")
    gamma = next(i for i in fq.graph.initializer if "gamma" in i.name)
    assert onnx.numpy_helper.to_array(gamma)[OUTLIER] < 40.0 / 4  # γ took the 1/s


def test_cli_calibrate_refuses_a_bad_alpha(tmp_path):
    onnx.save(ln_matmul(), tmp_path / "net.onnx")
    np.savez(tmp_path / "net.npz", **inputs())
    result = CliRunner().invoke(main, ["calibrate", str(tmp_path / "net.onnx"), "--smooth-quant", "2"])
    assert result.exit_code != 0 and "--smooth-quant" in result.output
    ok = CliRunner().invoke(main, ["calibrate", str(tmp_path / "net.onnx"), "--smooth-quant", "0.8", "--quiet"])
    assert ok.exit_code == 0, ok.output
