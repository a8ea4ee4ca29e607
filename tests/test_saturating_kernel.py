"""lpt.kernels.saturating: u8 × s8 sums with AVX2's int16 pair saturation, and --emulate avx2.

Everywhere: the fast kernels against a plain NumPy twin that forms every pair (NHWC im2col for
convolutions). Where onnxruntime's own u8 × s8 kernels saturate (an AVX2 CPU without VNNI, found by
an input built to saturate): onnxruntime's MatMulInteger, QLinearMatMul and QLinearConv equal the
emulation bit for bit and differ from the exact result.
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import lpt
from lpt.backend.emulation import Emulation, saturation_report
from lpt.kernels.output_stage import qlinear_multiplier, qlinear_output
from lpt.kernels.reference import conv_reference
from lpt.kernels.saturating import (INT16_MAX, ConvPairSaturation, PairSaturation, saturating_conv,
                                    saturating_matmul)

RNG = np.random.default_rng(15)


# -- the plain NumPy twins: every pair formed, in MLAS's order


def pairwise_reference(a, za, b, limit=INT16_MAX):
    """Σ_j clip(a[2j]·b[2j] + a[2j+1]·b[2j+1], −limit − 1, limit) − za·Σ_k b: int64 [M, N] (odd K: a zero pads)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if a.shape[1] % 2:
        a, b = np.pad(a, [(0, 0), (0, 1)]), np.pad(b, [(0, 1), (0, 0)])
    products = a[:, :, None] * b[None]  # [M, K, N]
    pairs = products[:, 0::2] + products[:, 1::2]
    return np.clip(pairs, -limit - 1, limit).sum(axis=1) - za * b.sum(axis=0)


def conv_pairwise_reference(x, zx, w, groups=1, pads=(0, 0, 0, 0), strides=(1, 1), limit=INT16_MAX):
    """onnxruntime's QLinearConv/ConvInteger as MLAS sums it: NHWC im2col rows (kernel position, then
    channel), the border holding zx, one pairwise GEMM per group; depthwise exact. int64 [N, OC, H', W']."""
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    if cg == 1 and oc == groups:
        return conv_reference(x, w, zx, 0, groups, strides, None, pads)
    padded = np.full((n, h + pads[0] + pads[2], wd + pads[1] + pads[3], c), zx, np.int64)
    padded[:, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = np.moveaxis(x, 1, -1)
    oh, ow = (padded.shape[1] - kh) // strides[0] + 1, (padded.shape[2] - kw) // strides[1] + 1
    out = np.zeros((n, oh, ow, oc), np.int64)
    per_group = oc // groups
    for g in range(groups):
        rows = np.stack([padded[:, i * strides[0]:i * strides[0] + kh, j * strides[1]:j * strides[1] + kw,
                                g * cg:(g + 1) * cg].reshape(n, -1)
                         for i in range(oh) for j in range(ow)], axis=1).reshape(-1, kh * kw * cg)
        b = np.moveaxis(w[g * per_group:(g + 1) * per_group], 1, -1).reshape(per_group, -1).T  # [(kh, kw, c), oc]
        out[..., g * per_group:(g + 1) * per_group] = pairwise_reference(rows, zx, b, limit).reshape(n, oh, ow, -1)
    return np.moveaxis(out, -1, 1)


def random_weights(shape):
    """int8 weights with the extremes per-channel symmetric quantization gives (±127 in every channel)."""
    w = RNG.integers(-127, 128, shape).astype(np.int8)
    if len(shape) == 2:  # a matmul's [K, N]: channels are columns
        w[0] = 127
    else:  # a convolution's [OC, IC/g, *kernel]
        w.reshape(shape[0], -1)[:, 0] = 127
    return w


# -- everywhere: the fast kernels against the twins


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 7, 5), (17, 64, 33), (5, 301, 16)])
@pytest.mark.parametrize("limit", [INT16_MAX, 20000])
def test_matmul_equals_the_pairwise_twin(m, k, n, limit):
    a = RNG.integers(100, 256, (m, k)).astype(np.uint8)
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    za = int(RNG.integers(0, 256))
    exact = (a.astype(np.int64) - za) @ b.astype(np.int64)
    peaks = np.zeros(n, np.int64)
    fast = exact + PairSaturation.of(b, limit).corrections(a, peaks)
    twin = pairwise_reference(a, za, b, limit)
    np.testing.assert_array_equal(fast, twin)
    if limit == INT16_MAX:
        np.testing.assert_array_equal(saturating_matmul(a, za, b), twin)
    if k > 1:
        assert (twin != exact).any()  # these inputs do saturate: the test can tell the two apart
    # peaks: the largest |pair sum| of each column, where one passes the limit
    a64, b64 = np.pad(a.astype(np.int64), [(0, 0), (0, k % 2)]), np.pad(b.astype(np.int64), [(0, k % 2), (0, 0)])
    products = a64[:, :, None] * b64[None]
    pairs = np.abs(products[:, 0::2] + products[:, 1::2])  # [M, K/2, N]
    largest = 255 * np.maximum(np.maximum(b64[0::2], 0) + np.maximum(b64[1::2], 0),
                               np.maximum(-b64[0::2], 0) + np.maximum(-b64[1::2], 0))
    risky = largest > limit
    largest_pairs = np.where(risky[None], pairs, 0).max(axis=(0, 1))
    passing = largest_pairs > limit
    np.testing.assert_array_equal(peaks[passing], largest_pairs[passing])
    assert (peaks[~passing] <= limit).all() and passing.any() == (k > 1)


def test_matmul_with_rows_few_or_most_past_the_screen_equals_the_pairwise_twin():
    """Enough rows that the distinct (a0, a1) values are counted, not sorted; one column pair whose every
    row passes the screen (its corrections gathered for every row), one where 300 rows do (scattered to
    them), one where none do: the twin's sums, and its peaks."""
    m, k, n, limit = 20000, 6, 5, 20000
    a = RNG.integers(0, 60, (m, k)).astype(np.uint8)
    a[:, :2] = RNG.integers(150, 256, (m, 2))
    few = RNG.choice(m, 300, replace=False)
    a[few, 2:4] = RNG.integers(200, 256, (300, 2))
    b = RNG.integers(90, 128, (k, n)).astype(np.int8) * np.array([1, -1, 1, -1, 1], np.int8)
    b[2:4, 1] = 0  # a column without risky pairs in the second column pair
    peaks = np.zeros(n, np.int64)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    fast = exact + PairSaturation.of(b, limit).corrections(a, peaks)
    twin = pairwise_reference(a, 0, b, limit)
    np.testing.assert_array_equal(fast, twin)
    products = a.astype(np.int64)[:, :, None] * b.astype(np.int64)[None]
    pair_sums = np.abs(products[:, 0::2] + products[:, 1::2])  # [M, K/2, N]
    past = (pair_sums > limit).any(axis=2)  # rows whose sums pass the limit, per column pair
    assert past[:, 0].sum() > m // 2 and 0 < past[few, 1].sum() == past[:, 1].sum()  # pair 1: only `few`
    assert not past[:, 2].any()
    sums = pair_sums.max(axis=(0, 1))
    np.testing.assert_array_equal(peaks, np.where(sums > limit, sums, 0))


def test_a_pair_of_small_or_opposite_weights_never_saturates():
    """The fast form's premise, exhaustively on the extremes: only same-sign |b0| + |b1| ≥ 129 can saturate."""
    values = np.arange(-128, 128)
    b0, b1 = np.meshgrid(values, values)
    worst = np.maximum(np.abs(255 * b0 + 255 * b1), np.maximum(np.abs(255 * b0), np.abs(255 * b1)))
    can = worst > INT16_MAX
    assert (can == ((b0 * b1 > 0) & (np.abs(b0) + np.abs(b1) >= 129))).all()
    pairs = PairSaturation.of(np.stack([b0.ravel(), b1.ravel()]).astype(np.int8))
    assert pairs.count == can.sum()


@pytest.mark.parametrize("c, oc, k, groups, pad, stride", [
    pytest.param(1, 8, 3, 1, 1, 1, id="one-channel-pairs-span-taps"),
    pytest.param(3, 8, 3, 1, 1, 2, id="odd-channels-stride-2"),
    pytest.param(16, 32, 3, 1, 1, 1, id="convsym-shape"),
    pytest.param(8, 16, 1, 1, 0, 1, id="pointwise"),
    pytest.param(6, 4, 3, 2, 1, 1, id="grouped-odd-channels"),
    pytest.param(8, 6, 3, 2, 1, 2, id="grouped-even-channels"),
    pytest.param(8, 8, 3, 8, 1, 1, id="depthwise-exact"),
])
def test_conv_equals_the_pairwise_twin(c, oc, k, groups, pad, stride):
    x = RNG.integers(60, 256, (2, c, 7, 6)).astype(np.uint8)
    w = random_weights((oc, c // groups, k, k))
    zx = int(RNG.integers(0, 256))
    pads, strides = [pad] * 4, [stride] * 2
    twin = conv_pairwise_reference(x, zx, w, groups, pads, strides)
    np.testing.assert_array_equal(saturating_conv(x, zx, w, groups, strides, None, pads), twin)
    exact = conv_reference(x, w, zx, 0, groups, strides, None, pads)
    assert (twin != exact).any() != (groups == c == oc)  # saturates, except depthwise
    pairs = ConvPairSaturation.of(w, groups, strides, None, pads, limit=20000)
    np.testing.assert_array_equal(exact + pairs.corrections(x, zx),
                                  conv_pairwise_reference(x, zx, w, groups, pads, strides, limit=20000))


# -- where onnxruntime saturates: its kernels, bit for bit


def _session(nodes, inputs, output_type, initializers, opset=13):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", output_type, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _matmul_integer(a, za, b):
    k, n = b.shape
    session = _session([helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"])],
                       [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape))], TensorProto.INT32,
                       [helper.make_tensor("b", TensorProto.INT8, [k, n], b.tobytes(), raw=True),
                        helper.make_tensor("za", TensorProto.UINT8, [], [za])])
    return session.run(None, {"a": a})[0]


@functools.cache
def onnxruntime_saturates() -> bool:
    """255·127 + 255·127 = 64 770 in one pair: onnxruntime returns 2·32 767 where its u8 × s8 kernel saturates."""
    got = _matmul_integer(np.full((1, 4), 255, np.uint8), 0, np.full((4, 1), 127, np.int8))
    return int(got[0, 0]) != 4 * 255 * 127


needs_saturation = pytest.mark.skipif(
    "not onnxruntime_saturates()",
    reason="onnxruntime's u8×s8 kernels are exact on this CPU (VNNI/AMX): there is no saturation to compare with")


def _qlinear(op, x, w, zx, attrs=None, opset=13):
    """onnxruntime's QLinearConv/QLinearMatMul on u8 x, s8 w (per output channel scales), and the same
    requantization applied by lpt to an accumulator."""
    channels = w.shape[0] if op == "QLinearConv" else w.shape[1]
    sx, sw, sy, zy = 0.02, np.linspace(0.005, 0.01, channels).astype(np.float32), 8.0, 7
    initializers = [helper.make_tensor("w", TensorProto.INT8, w.shape, w.tobytes(), raw=True),
                    helper.make_tensor("sx", TensorProto.FLOAT, [], [sx]),
                    helper.make_tensor("zx", TensorProto.UINT8, [], [zx]),
                    helper.make_tensor("sw", TensorProto.FLOAT, [channels], sw),
                    helper.make_tensor("zw", TensorProto.INT8, [channels], [0] * channels),
                    helper.make_tensor("sy", TensorProto.FLOAT, [], [sy]),
                    helper.make_tensor("zy", TensorProto.UINT8, [], [zy])]
    node = helper.make_node(op, ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"], **(attrs or {}))
    session = _session([node], [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
                       TensorProto.UINT8, initializers, opset)
    axis = 1 if op == "QLinearConv" else -1
    return session.run(None, {"x": x})[0], lambda acc: qlinear_output(acc, qlinear_multiplier(sx, sw, sy), zy, 0, 255,
                                                                      axis=axis)


@needs_saturation
@pytest.mark.parametrize("m, k", [(1, 9), (17, 64), (4, 300)])  # one row takes MLAS's GEMV kernel
def test_onnxruntime_matmulinteger_saturates_as_emulated(m, k):
    a = RNG.integers(120, 256, (m, k)).astype(np.uint8)
    b = random_weights((k, 24))
    ours = saturating_matmul(a, 3, b)
    np.testing.assert_array_equal(_matmul_integer(a, 3, b), ours)
    assert (ours != (a.astype(np.int64) - 3) @ b.astype(np.int64)).any()


@needs_saturation
def test_onnxruntime_qlinearmatmul_saturates_as_emulated():
    a = RNG.integers(100, 256, (2, 5, 40)).astype(np.uint8)
    b = random_weights((40, 16))
    theirs, requantize = _qlinear("QLinearMatMul", a, b, 11, opset=21)
    np.testing.assert_array_equal(theirs, requantize(saturating_matmul(a, 11, b)))
    assert (theirs != requantize((a.astype(np.int64) - 11) @ b.astype(np.int64))).any()


@needs_saturation
@pytest.mark.parametrize("c, oc, groups, stride", [
    pytest.param(16, 32, 1, 1, id="convsym-indirect-kernel"),  # IC % 4 = 0, OC % 8 = 0, OC ≥ 16
    pytest.param(1, 8, 1, 1, id="im2col-gemm-one-channel"),
    pytest.param(3, 16, 1, 2, id="im2col-gemm-odd-channels"),
    pytest.param(8, 16, 2, 1, id="grouped"),
])
def test_onnxruntime_qlinearconv_saturates_as_emulated(c, oc, groups, stride):
    x = RNG.integers(100, 256, (2, c, 9, 8)).astype(np.uint8)
    w = random_weights((oc, c // groups, 3, 3))
    attrs = dict(group=groups, pads=[1] * 4, strides=[stride] * 2)
    theirs, requantize = _qlinear("QLinearConv", x, w, 5, attrs)
    np.testing.assert_array_equal(theirs, requantize(saturating_conv(x, 5, w, groups, attrs["strides"], None, [1] * 4)))
    assert (theirs != requantize(conv_reference(x, w, 5, 0, groups, attrs["strides"], None, [1] * 4))).any()


@needs_saturation
def test_onnxruntime_depthwise_qlinearconv_is_exact():
    x = RNG.integers(100, 256, (2, 16, 9, 8)).astype(np.uint8)
    w = random_weights((16, 1, 3, 3))
    theirs, requantize = _qlinear("QLinearConv", x, w, 5, dict(group=16, pads=[1] * 4))
    np.testing.assert_array_equal(theirs, requantize(conv_reference(x, w, 5, 0, 16, None, None, [1] * 4)))
    assert ConvPairSaturation.of(w, 16).count == 0  # and the emulation adds nothing


# -- the backend's emulation and lpt compare --emulate


@pytest.fixture(scope="module")
def digits_cnn_fq():
    result = lpt.calibration.calibrate("models/digits_cnn.onnx", "models/digits_cnn.npz", quiet=True,
                                       overflow_fix="none")
    return result.model


def test_emulated_plan_reproduces_the_saturating_kernel(digits_cnn_fq):
    """The first conv of digits_cnn (1 input channel: pairs span taps) saturates; the emulated plan's
    integers equal lpt's output stage applied to the NumPy twin's accumulators."""
    int8 = lpt.clone(digits_cnn_fq)
    lpt.transform(int8)
    x = {"input": np.load("models/digits_cnn.test.npz")["input"][:40]}
    exact, emulated = lpt.compile_model(int8), lpt.compile_model(int8, emulate="avx2")
    ours = emulated.run(x, keep=True)
    step = next(s for s in emulated.steps if s.nodes[0] == "/conv1/Conv/integer")
    layer, src = step.layer, ours[step.inputs[0]]
    twin = conv_pairwise_reference(src, int(layer.src_zero_point), layer.weights, pads=layer.attribute("pads"))
    from lpt import kernels

    expected = layer.destination.quantize(kernels.output_stage(twin, layer.multiplier, layer.bias, layer.post_ops))
    np.testing.assert_array_equal(ours[step.outputs[0]], expected)
    assert (exact.run(x, keep=True)[step.outputs[0]] != expected).any()
    conv1 = saturation_report(emulated)[0]
    assert conv1.name == "/conv1/Conv" and conv1.saturated_channels == 8 and conv1.changed_channels >= 6
    assert 0 < conv1.saturated_share < 1 and conv1.sqnr_db < 30


@pytest.mark.parametrize("name, count", [("digits_cnn", 60), ("digits_transformer", 20)])
def test_emulation_without_measuring_counts_on_the_touched_rows_what_the_full_pass_counts(name, count):
    """measure=False (the overflow fix) runs the exact output stage again only on the rows some correction
    touches; measure=True on the whole output. The same outputs, and per layer the same channels saturated
    and moved, peaks and counts, at the overflow fix's margin (conv, matmul, Q·Kᵀ of two activations)."""
    fq = lpt.calibration.calibrate(f"models/{name}.onnx", f"models/{name}.npz", quiet=True, subset_size=count,
                                   overflow_fix="none").model
    int8 = lpt.clone(fq)
    lpt.transform(int8)
    x = {k: v[:count] for k, v in np.load(f"models/{name}.npz").items() if k in {i.name for i in int8.graph.inputs}}
    runs = {}
    for measure in (True, False):
        plan = lpt.compile_model(int8, emulate=Emulation(limit=20000, measure=measure))
        outputs = plan.run(x)
        stats = {s.nodes[0]: s.run.statistics for s in plan.steps if getattr(s.run, "statistics", None) is not None}
        runs[measure] = outputs, stats
    (full, full_stats), (rows, row_stats) = runs[True], runs[False]
    for output in full:
        np.testing.assert_array_equal(full[output], rows[output])
    assert full_stats.keys() == row_stats.keys()
    for layer, a in full_stats.items():
        b = row_stats[layer]
        np.testing.assert_array_equal(a.saturated, b.saturated)
        np.testing.assert_array_equal(a.changed, b.changed)
        np.testing.assert_array_equal(a.peak, b.peak)
        assert (a.accumulators, a.saturated_accumulators) == (b.accumulators, b.saturated_accumulators), layer
    assert sum(a.changed.sum() for a in full_stats.values()) > 0  # something moved: the test can tell


def test_compare_emulate_scores_what_onnxruntime_scores_on_avx2(digits_cnn_fq):
    emulated = lpt.compare("models/digits_cnn.onnx", digits_cnn_fq, "models/digits_cnn.test.npz", labels="labels",
                           emulate="avx2").to_dict()
    exact = lpt.compare("models/digits_cnn.onnx", digits_cnn_fq, "models/digits_cnn.test.npz",
                        labels="labels").to_dict()
    assert emulated["accuracy"]["drop"] > 0.005 and exact["accuracy"]["drop"] == 0  # 0.74 pt lost on AVX2
    assert emulated["outputs"]["logits"]["sqnr_db"] < exact["outputs"]["logits"]["sqnr_db"] - 20
    assert [s["name"] for s in emulated["saturation"]] == ["/conv1/Conv", "/conv2/Conv", "/fc1/Gemm", "/fc2/Gemm"]
    assert "saturation" not in exact
    if onnxruntime_saturates():  # onnxruntime's own run of the same model on this CPU: the same accuracy
        theirs = lpt.compare("models/digits_cnn.onnx", digits_cnn_fq, "models/digits_cnn.test.npz", labels="labels",
                             backend="onnxruntime").to_dict()
        assert theirs["accuracy"]["candidate"] == emulated["accuracy"]["candidate"]
        assert abs(theirs["outputs"]["logits"]["sqnr_db"] - emulated["outputs"]["logits"]["sqnr_db"]) < 0.1


def test_emulation_is_refused_where_it_cannot_apply(digits_cnn_fq):
    with pytest.raises(lpt.LptError, match="emulate"):
        lpt.compare("models/digits_cnn.onnx", digits_cnn_fq, "models/digits_cnn.test.npz", backend="onnxruntime",
                    emulate="avx2")
    with pytest.raises(lpt.LptError, match="unknown emulation 'sse2'"):
        lpt.compile_model(digits_cnn_fq, emulate="sse2")
    assert Emulation.of("avx2") == Emulation()
