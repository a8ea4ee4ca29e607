"""Scale-out on Ray (lpt.distributed): the merged statistics and metrics equal one process's.

The merge methods are tested on arrays (no Ray needed); the Ray tests start a local Ray with two
CPUs once for the module and are skipped where Ray is not installed (pip install 'lpt[ray]').
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import lpt
from cli.main import main
from lpt.calibration import calibrate
from lpt.calibration.estimators import HistogramCollector, MeanMinMaxCollector, MinMaxCollector
from lpt.errors import LptError

MODELS = Path(__file__).resolve().parent.parent / "models"
MODEL = MODELS / "digits_cnn.onnx"
TRAIN, TEST = MODELS / "digits_cnn.npz", MODELS / "digits_cnn.test.npz"


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'lpt[ray]'")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def _batches(seed: int, saturating: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    batches = [(rng.standard_normal((4, 64)) * rng.choice([0.3, 1, 5]) + rng.choice([0, 2])).astype(np.float32)
               for _ in range(9)]
    if saturating:  # values at exact powers of two times the first batch's max|x|: they land on bin edges
        top = float(np.abs(batches[0]).max())
        for k, batch in enumerate(batches[1:]):
            batch[0, :2] = top * 2 ** (k % 3), -top * 2 ** (k % 2)
    return batches


@pytest.mark.parametrize("kind", [MinMaxCollector, MeanMinMaxCollector, HistogramCollector])
@pytest.mark.parametrize("seed, saturating", [(0, False), (1, True), (2, True), (3, False)])
def test_merged_shards_equal_one_pass(kind, seed, saturating):
    """The first batch alone, then the rest dealt to 3 shards seeded from it, merged: the same state."""
    batches = _batches(seed, saturating)
    one = kind(bins=64) if kind is HistogramCollector else kind()
    for batch in batches:
        one.update(batch)
    first = kind(bins=64) if kind is HistogramCollector else kind()
    first.update(batches[0])
    shards = [first.seeded() for _ in range(3)]
    for i, batch in enumerate(batches[1:][::-1]):  # another order too
        shards[i % 3].update(batch)
    for shard in shards:
        first.merge(shard)
    assert first.range() == one.range()
    if kind is HistogramCollector:
        assert first.width == one.width
        np.testing.assert_array_equal(first.counts, one.counts)


def test_histogram_merge_moves_clipped_values_where_a_wider_width_puts_them():
    """x = bins·w lands in the top bin (clipped); once w doubles it belongs in bin bins/2, as if binned at 2w."""
    h = HistogramCollector(bins=16)
    h.update(np.array([-1.0, 2.0], np.float32))  # w = 2/16: 2.0 clipped into the top bin
    assert h.clipped == [0, 1]
    h.update(np.array([4.0], np.float32))  # w doubles
    direct = HistogramCollector(bins=16)
    direct.width = h.width
    direct.update(np.array([-1.0, 2.0, 4.0], np.float32))
    np.testing.assert_array_equal(h.counts, direct.counts)
    assert h.counts[16 + 8] == 1  # 2.0 at w = 0.25: bin 8, not 7


def test_without_ray_the_option_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    from lpt.distributed import connect

    with pytest.raises(LptError, match=r"^--ray needs Ray.*pip install 'lpt\[ray\]'$"):
        connect()


def test_an_address_nothing_answers_is_a_one_line_error_at_once():
    """Ray alone retries an address that does not answer for minutes; lpt asks the port first."""
    import socket
    import time

    from lpt.distributed import _check_reachable  # what connect() asks before ray.init()

    with socket.socket() as unused:  # a port on this machine that nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(LptError, match=rf"^--ray ray://127.0.0.1:{port}: cannot reach 127.0.0.1:{port} \("):
        _check_reachable(f"ray://127.0.0.1:{port}")
    with pytest.raises(LptError, match=r"^--ray nowhere\.invalid:1: cannot reach nowhere\.invalid:1 \("):
        _check_reachable("nowhere.invalid:1")
    assert time.monotonic() - start < 10
    _check_reachable("auto")  # left to Ray


@pytest.mark.parametrize("estimator", ["minmax", "mean_minmax", "percentile"])
def test_calibrate_on_ray_gives_one_process_ranges(ray, estimator):
    """Two workers, 160 samples in 5 batches: every activation range equals the single-process one."""
    options = dict(estimator=estimator, subset_size=160, overflow_fix="none", quiet=True)
    one = calibrate(MODEL, TRAIN, **options)
    shared = calibrate(MODEL, TRAIN, **options, ray="local", ray_workers=2)
    assert shared.report.samples == one.report.samples == 160
    assert shared.ranges == one.ranges


def test_compare_on_ray_gives_one_process_metrics(ray, tmp_path):
    """`lpt compare --ray`: the same top-1, SQNR (to float64 rounding) and per-layer ranking."""
    fq = calibrate(MODEL, TRAIN, subset_size=64, overflow_fix="none", quiet=True).model
    lpt.save(fq, tmp_path / "m.fq.onnx")
    one = lpt.compare(MODEL, tmp_path / "m.fq.onnx", TEST, labels="labels", per_layer=True).to_dict()
    result = CliRunner().invoke(main, ["compare", str(MODEL), str(tmp_path / "m.fq.onnx"), "--data", str(TEST),
                                       "--labels", "labels", "--per-layer", "--json", str(tmp_path / "c.json"),
                                       "--ray", "--ray-workers", "2"])
    assert result.exit_code == 0, result.output
    shared = json.loads((tmp_path / "c.json").read_text())
    assert shared["accuracy"] == one["accuracy"]
    assert shared["outputs"]["logits"]["sqnr_db"] == pytest.approx(one["outputs"]["logits"]["sqnr_db"], rel=1e-12)
    assert [layer["name"] for layer in shared["layers"]] == [layer["name"] for layer in one["layers"]]
    assert [layer["sqnr_db"] for layer in shared["layers"]] == pytest.approx([layer["sqnr_db"] for layer in one["layers"]],
                                                                            rel=1e-12)
