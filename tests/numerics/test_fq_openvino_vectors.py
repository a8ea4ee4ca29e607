"""fake_quantize against FakeQuantize outputs computed by OpenVINO's CPU runtime (the shared test vectors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lpt.numerics import fake_quantize, fake_quantize_levels, fake_quantize_spec

# shared/ sits beside the repository, on developer machines and in CI alike.
VECTORS = Path(__file__).resolve().parents[3] / "shared" / "testdata" / "fakequantize_openvino.npz"
FIELDS = ("x", "il", "ih", "ol", "oh", "levels", "expected")
# input_low >= input_high: OpenVINO's CPU plugin and the spec disagree there, and lpt follows the spec.
SPEC_NOT_OPENVINO = {"binarization_il_eq_ih", "inverted_input_interval"}


def _load_cases() -> dict[str, dict[str, np.ndarray]]:
    with np.load(VECTORS) as data:
        names = sorted({key.split("/")[0] for key in data.files})
        return {name: {field: data[f"{name}/{field}"] for field in FIELDS} for name in names}


CASES = _load_cases()


def _run(case) -> np.ndarray:
    return fake_quantize(*(case[field] for field in ("x", "il", "ih", "ol", "oh", "levels")))


def test_the_file_holds_the_19_cases():
    assert len(CASES) == 19
    assert SPEC_NOT_OPENVINO <= CASES.keys()


@pytest.mark.parametrize("name", sorted(CASES.keys() - SPEC_NOT_OPENVINO))
def test_matches_openvino_bit_for_bit(name):
    case = CASES[name]
    y = _run(case)
    assert y.dtype == np.float32 and y.shape == case["expected"].shape
    # Compare bit patterns: -0.0 vs 0.0 and the last ulp both count.
    np.testing.assert_array_equal(y.view(np.uint32), case["expected"].view(np.uint32))


def test_inverted_input_interval_follows_the_spec_not_openvino():
    """il > ih: OpenVINO crops x to [il, ih] literally, so every x becomes il and lands on output_low.

    The spec's formula instead maps (ih, il] onto the levels (and x ≤ ih → ol, x > il → oh); lpt computes that.
    """
    case = CASES["inverted_input_interval"]
    assert case["il"] > case["ih"]
    assert np.all(case["expected"] == case["ol"])  # OpenVINO: output_low everywhere

    steps = int(case["levels"]) - 1
    spec_levels = fake_quantize_spec(case["x"], case["il"], case["ih"], 0, steps, case["levels"])
    np.testing.assert_array_equal(fake_quantize_levels(case["x"], case["il"], case["ih"], case["levels"]), spec_levels)

    y = _run(case)
    spec = fake_quantize_spec(*(case[field] for field in ("x", "il", "ih", "ol", "oh", "levels")))
    # The f32 grid (osc, osh, one fma) carries a few ulps of the interval ends (±1): 8 ulps allowed.
    np.testing.assert_allclose(y, spec, rtol=0, atol=2.0**-21)
    assert np.count_nonzero(y != case["expected"]) >= 10  # the divergence is real, not an empty case


def test_equal_input_limits_threshold_like_the_spec_where_openvino_gives_nan():
    """il == ih: the spec thresholds at il (x ≤ il → ol, else oh); OpenVINO's (levels−1)/0 = inf gives 0·inf = NaN."""
    case = CASES["binarization_il_eq_ih"]
    assert case["il"] == case["ih"]
    assert np.all(np.isnan(case["expected"]))

    expected = np.where(case["x"] <= case["il"], case["ol"], case["oh"]).astype(np.float32)
    np.testing.assert_array_equal(_run(case), expected)
    assert {-1.0, 1.0} <= set(expected.ravel().tolist())  # both branches occur
