"""Large activations stay within a budget: calibration runs a batch in parts, the cross-check reads few samples."""

import numpy as np

from lpt.calibration import calibrate, statistics
from lpt.calibration.data import CalibrationData, InputSpec
from lpt.execute import CHECK_SAMPLES, check_samples
from tests.calibration.nets import as_ir, conv_inputs, conv_net


def ranges(result):
    return {n.inputs[0].name: [n.inputs[i].const_value.numpy().item() for i in (1, 2)]
            for n in result.model.graph if n.op_type == "FakeQuantize" and n.inputs[1].const_value.numpy().size == 1}


def test_a_batch_past_the_activation_budget_runs_in_parts_with_the_same_ranges(monkeypatch):
    whole = calibrate(as_ir(conv_net()), conv_inputs(40), quiet=True, bias_correction=False)
    runs = []
    session = statistics.session

    def counting_session(proto):
        inner = session(proto)

        class Counting:
            def run(self, names, feeds):
                runs.append(len(feeds["x"]))
                return inner.run(names, feeds)
        return Counting()

    monkeypatch.setattr(statistics, "session", counting_session)
    monkeypatch.setattr(statistics, "ACTIVATION_BUDGET", 3 * 4 * 8 * 8 * 4)  # a few samples of conv's [4, 8, 8] f32
    parts = calibrate(as_ir(conv_net()), conv_inputs(40), quiet=True, bias_correction=False)
    assert runs[0] == 1 and max(runs[1:]) < 32 and sum(runs[1:]) == 40  # one sample measured, then parts
    assert ranges(parts) == ranges(whole) and ranges(whole)


def test_the_cross_check_reads_at_most_a_few_samples_and_one_large_one():
    small = CalibrationData({"x": np.zeros((32, 3, 8, 8), np.float32)}, [InputSpec("x", np.dtype(np.float32), (None, 3, 8, 8))])
    assert len(check_samples(small)["x"]) == CHECK_SAMPLES
    large = CalibrationData({"x": np.zeros((4, 3, 640, 640), np.float32)},
                            [InputSpec("x", np.dtype(np.float32), (None, 3, 640, 640))])
    assert len(check_samples(large)["x"]) == 1


def test_large_samples_make_smaller_batches():
    spec = InputSpec("x", np.dtype(np.float32), (None, 3, 640, 640))  # 4.9 MB a sample: three fit 16 MB
    images = CalibrationData({"x": np.zeros((7, 3, 640, 640), np.float32)}, [spec])
    assert [len(b["x"]) for b in images.batches()] == [3, 3, 1]
    small = CalibrationData({"x": np.zeros((40, 3, 8, 8), np.float32)}, [InputSpec("x", np.dtype(np.float32), (None, 3, 8, 8))])
    assert [len(b["x"]) for b in small.batches()] == [32, 8]


def test_the_auto_search_pass_runs_in_the_parts_the_statistics_pass_ran_in(monkeypatch):
    from lpt.calibration import range_search

    runs = {statistics: [], range_search: []}
    for module in runs:
        def counting_session(proto, inner_session=module.session, sizes=runs[module]):
            inner = inner_session(proto)

            class Counting:
                def run(self, names, feeds):
                    sizes.append(len(feeds["x"]))
                    return inner.run(names, feeds)
            return Counting()
        monkeypatch.setattr(module, "session", counting_session)
    monkeypatch.setattr(statistics, "ACTIVATION_BUDGET", 3 * 4 * 8 * 8 * 4)
    calibrate(as_ir(conv_net()), conv_inputs(40), estimator="auto", quiet=True, bias_correction=False)
    measured, searched = runs[statistics][1:], runs[range_search]
    assert max(searched) == max(measured) < 32 and sum(searched) == sum(measured) == 40
