"""The probe, LPT_ONEDNN, the reasons the engine refuses a step, and the build without it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import lpt.native
from lpt.kernels import Relu, Sum
from lpt.kernels.output_stage import Clip, Gelu, LeakyRelu, Sigmoid
from lpt.native import routes


def test_the_split_route_is_exact_everywhere_and_the_probe_picks_an_exact_route():
    assert "split" in lpt.native.exact_routes()
    assert lpt.native.route() in lpt.native.exact_routes() or os.environ.get("LPT_ONEDNN", "").lower() == "off"


def test_the_probe_catches_a_saturating_kernel(monkeypatch):
    """On a CPU without VNNI, u8s8 is the route the probe must reject; where it is exact, split must agree with it."""
    saturating = "u8s8" not in lpt.native.exact_routes()
    weights = np.full((4, 256, 1, 1), 127, np.int8)
    acc = lpt.native.Conv(weights, route="u8s8", threads=1).accumulate(np.full((1, 256, 2, 2), 255, np.uint8))
    assert np.all(acc == 255 * 127 * 256) != saturating


@pytest.mark.parametrize("value, expected", [
    pytest.param("split", "split", id="split"),
    pytest.param("s16", "s16", id="s16"),
    pytest.param("off", None, id="off"),
    pytest.param("auto", "first-exact", id="auto"),
    pytest.param("nonsense", "first-exact", id="unknown-value"),
    pytest.param("u8s8", "u8s8-where-exact", id="u8s8"),
])
def test_the_environment_variable_forces_a_route(monkeypatch, caplog, value, expected):
    monkeypatch.setenv("LPT_ONEDNN", value)
    first_exact = lpt.native.exact_routes()[0]
    with caplog.at_level(logging.WARNING, logger="lpt.native.routes"):
        chosen = routes.route.__wrapped__()  # past the once-per-process cache
    if expected == "first-exact":
        assert chosen == first_exact
    elif expected == "u8s8-where-exact":
        exact = "u8s8" in lpt.native.exact_routes()
        assert chosen == ("u8s8" if exact else first_exact)
        assert ("not exact on this CPU" in caplog.text) != exact
    else:
        assert chosen == expected
    assert ("is not one of" in caplog.text) == (value == "nonsense")


def test_the_s16_route_hands_grouped_and_3d_convolutions_to_split():
    """lpt's own kernel runs one-group and depthwise 1-D/2-D convolutions and matmuls; the rest must still
    run exactly."""
    assert lpt.native.Conv(np.ones((4, 2, 3, 3), np.int8), route="s16").route == "s16"
    assert lpt.native.Conv(np.ones((4, 2, 3), np.int8), route="s16").route == "s16"
    depthwise = lpt.native.Conv(np.full((4, 1, 3, 3), -128, np.int8), groups=4, route="s16")
    assert depthwise.route == "s16"
    assert depthwise.accumulate(np.full((1, 4, 3, 3), 255, np.uint8)).tolist() == [[[[-128 * 255 * 9]]] * 4]
    grouped = lpt.native.Conv(np.ones((4, 2, 3, 3), np.int8), groups=2, route="s16")
    assert grouped.route == "split"
    assert lpt.native.Conv(np.ones((4, 2, 3, 3, 3), np.int8), route="s16").route == "split"
    acc = grouped.accumulate(np.full((1, 4, 3, 3), 255, np.uint8))
    assert acc.tolist() == [[[[255 * 18]]] * 4]


@pytest.mark.parametrize("post_ops, dst_scale, route, staged", [
    ((), 0.5, "u8s8", True),
    ((Relu(),), 0.5, "u8s8", True),
    ((Clip(0.0, 6.0),), 0.5, "u8s8", True),
    ((LeakyRelu(0.1),), 0.5, "u8s8", True),
    ((Relu(),), None, "u8s8", True),  # a float32 destination
    ((LeakyRelu(-0.5),), None, "u8s8", False),  # −0·slope would be +0 where lpt keeps −0
    ((Sigmoid(),), 0.5, "u8s8", False),  # lpt's own Sigmoid: oneDNN's would round otherwise
    ((Gelu(1.4142135, 1.0, 0.5),), 0.5, "u8s8", False),
    ((Relu(), Clip(0.0, 6.0)), 0.5, "u8s8", False),
    ((Relu(),), 1e-7, "u8s8", False),  # past tiny_values_quantize_as_zero's bound
    ((Relu(),), 0.5, "split", False),
])
def test_onednn_applies_the_output_stages_it_computes_as_lpt_does(post_ops, dst_scale, route, staged):
    """oneDNN's primitive applies an output stage of a Relu, Clip, LeakyRelu or none, on route u8s8 (the split
    route sums two passes first); lpt stages the others itself."""
    # only made, never run: the decision is the operation's, so it holds on a CPU where the route is not exact
    conv = lpt.native.Conv(np.ones((8, 4, 3, 3), np.int8), post_ops=post_ops, dst_scale=dst_scale,
                           dst_dtype=None if dst_scale is None else np.uint8, route=route)
    assert lpt.native.engine.stages(conv._operation) == staged


def test_few_products_per_output_take_s16_where_the_route_is_u8s8(monkeypatch):
    """A one-group layer of under 32 products per output (a 3×3 stem of 1 or 3 channels) runs on lpt's s16 where
    the route is u8s8 and oneDNN would not apply its output stage; wider reductions, depthwise layers and the
    other routes keep theirs."""
    monkeypatch.setattr(routes, "exact_routes", lambda: ("u8s8", "s16", "split"))
    assert routes.conv_route("u8s8", 9, 1, 2) == "s16"
    assert routes.conv_route("u8s8", 27, 1, 1) == "s16"
    assert routes.conv_route("u8s8", 72, 1, 2) == "u8s8"
    assert routes.conv_route("u8s8", 9, 48, 2) == "u8s8"  # depthwise
    assert routes.conv_route("u8s8", 9, 1, 3) == "u8s8"
    assert routes.conv_route("split", 9, 1, 2) == "split"
    monkeypatch.setattr(routes, "exact_routes", lambda: ("u8s8", "split"))  # no AVX2
    assert routes.conv_route("u8s8", 9, 1, 2) == "u8s8"
    monkeypatch.setattr(routes, "route", lambda: "u8s8")
    stem = lpt.native.Conv(np.ones((8, 1, 3, 3), np.int8), pads=(1, 1, 1, 1))
    assert stem.route == "u8s8"
    monkeypatch.setattr(routes, "exact_routes", lambda: ("u8s8", "s16", "split"))
    stem = lpt.native.Conv(np.ones((8, 1, 3, 3), np.int8), pads=(1, 1, 1, 1), post_ops=(Sigmoid(),))
    assert stem.route == "s16"
    assert stem.accumulate(np.full((1, 1, 3, 3), 2, np.uint8))[0, :, 1, 1].tolist() == [18] * 8
    # where oneDNN applies the output stage itself (a Relu, or none), its u8s8 kernel is the faster
    assert routes.conv_route("u8s8", 9, 1, 2, staged=True) == "u8s8"
    for stage in ({}, dict(post_ops=(Relu(),), dst_scale=0.5, dst_dtype=np.uint8)):
        assert lpt.native.Conv(np.ones((8, 1, 3, 3), np.int8), pads=(1, 1, 1, 1), **stage).route == "u8s8"
    assert lpt.native.Conv(np.ones((8, 1, 3, 3), np.int8), route="u8s8").route == "u8s8"  # a route asked for


@pytest.mark.parametrize("make, reason", [
    pytest.param(lambda: lpt.native.Conv(np.ones((2, 2, 3, 3), np.int8), weight_zero_point=3), "weight zero point",
                 id="weight-zero-point"),
    pytest.param(lambda: lpt.native.Conv(np.ones((2, 2, 3, 3), np.uint8)), "uint8 weights", id="uint8-weights"),
    pytest.param(lambda: lpt.native.Conv(np.ones((2, 2, 3, 3), np.int8), post_ops=(Relu(), Sum(np.ones(2, np.float32)))),
                 "post-op Sum", id="sum"),
    pytest.param(lambda: lpt.native.Conv(np.ones((2, 2, 3, 3), np.int8), dst_scale=np.array([0.1, 0.2])),
                 "per-channel destination", id="per-channel-destination"),
    pytest.param(lambda: lpt.native.MatMul(np.ones((70000, 2), np.int8)), "overflow int32", id="long-reduction"),
    pytest.param(lambda: lpt.native.Conv(np.ones((2, 2, 1, 1, 1, 1), np.int8)), "4 spatial axes", id="4-d"),
])
def test_what_stays_on_lpts_path_is_refused_with_a_reason(make, reason):
    with pytest.raises(lpt.native.Unsupported, match=reason):
        make()


def test_bad_arguments_are_errors_not_refusals():
    with pytest.raises(ValueError, match="3 groups"):
        lpt.native.Conv(np.ones((4, 2, 3, 3), np.int8), groups=3)
    conv = lpt.native.Conv(np.ones((4, 2, 3, 3), np.int8), src_zero_point=200)
    with pytest.raises(ValueError, match="outside int8"):
        conv(np.zeros((1, 2, 5, 5), np.int8))
    with pytest.raises(ValueError, match="2 input channels"):
        conv(np.zeros((1, 3, 5, 5), np.uint8))


def test_off_turns_the_engine_off_and_says_so():
    code = ("import lpt.native as n, numpy as np\n"
            "print(n.available(), n.route(), n.unavailable_reason())\n"
            "try:\n    n.Conv(np.ones((1, 1, 1, 1), np.int8))\n"
            "except n.Unsupported as refusal:\n    print(refusal)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "LPT_ONEDNN": "off"})
    assert result.stdout.splitlines() == ["False None LPT_ONEDNN=off",
                                          "the native engine is not available: LPT_ONEDNN=off"]


# Levels next to halves (test_native_matmul's halves test) from a matmul whose output stage oneDNN applies on
# u8s8, computed with LPT_ONEDNN_STAGE as given: the reference's levels, the engine's, each quotient, and
# the kernel that ran. Weights of 0 and 1 reach no int16 limit, so the accumulators are exact on any CPU.
_HALVES = """
import json, numpy as np, lpt.native
from lpt.kernels.output_stage import output_stage
scale, zero_point = np.float32(0.0373), 3
acc = np.arange(-128, 128, dtype=np.int32)
src = np.repeat((acc + 128).astype(np.uint8)[:, None], 2, axis=1)
multiplier = (np.float32(scale / 2).view(np.int32) + np.arange(-24, 24, dtype=np.int32)).view(np.float32)
weights = np.zeros((2, multiplier.size), np.int8)
weights[0] = 1
matmul = lpt.native.MatMul(weights, src_zero_point=128, route="u8s8", threads=1, multiplier=multiplier,
                           dst_scale=scale, dst_zero_point=zero_point, dst_dtype=np.uint8)
got = matmul(src)
accumulators = acc[:, None] * np.ones(multiplier.size, np.int32)
expected = output_stage(accumulators, multiplier, None, (), scale, zero_point, 0, 255, axis=-1)
quotients = (accumulators.astype(np.float32) * multiplier).astype(np.float64) / np.float64(scale)
print(json.dumps(dict(got=got.tolist(), expected=expected.tolist(), quotients=quotients.tolist(),
                      implementation=matmul.implementation)))
"""


def test_a_reciprocal_stage_moves_levels_next_to_a_half_by_one_at_most():
    """LPT_ONEDNN_STAGE=reciprocal: oneDNN multiplies by 1/s where lpt divides by s (OpenVINO's way, faster).
    Levels may then differ from lpt's, by one, and only where the quotient lies next to a half."""
    import json

    result = subprocess.run([sys.executable, "-c", _HALVES], capture_output=True, text=True, check=True,
                            env={**os.environ, "LPT_ONEDNN_STAGE": "reciprocal"})
    run = json.loads(result.stdout)
    got, expected, quotients = (np.array(run[k]) for k in ("got", "expected", "quotients"))
    moved = got != expected
    assert np.abs(got - expected).max() <= 1
    assert np.all(np.abs(np.abs(quotients[moved] - np.floor(quotients[moved])) - 0.5) < 1e-4)
    if "ref" not in run["implementation"]:  # oneDNN's reference kernels leave the stage to lpt
        assert moved.any()
    exact = subprocess.run([sys.executable, "-c", _HALVES], capture_output=True, text=True, check=True,
                           env={k: v for k, v in os.environ.items() if k != "LPT_ONEDNN_STAGE"})
    run = json.loads(exact.stdout)
    assert run["got"] == run["expected"]
