"""lpt.benchmark's turns: how many calls each engine gets (never how long they take)."""

import time

from lpt import benchmark


def test_each_block_runs_its_share_of_repeats_and_a_fast_engine_fills_the_minimum_time(monkeypatch):
    monkeypatch.setattr(benchmark, "SETTLE_SECONDS", 0.0)
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(benchmark.MIN_BLOCK_SECONDS)

    medians = benchmark.median_ms_in_turns({"fast": fast, "slow": slow}, repeats=10, rounds=5)
    assert set(medians) == {"fast", "slow"}
    assert calls["slow"] == 5 * (1 + 2)  # per round: the warm call and the block's two repeats
    assert calls["fast"] > 5 * 100  # 20 ms of calls that take microseconds


def test_the_machine_a_figure_was_measured_on(tmp_path):
    """The CPU's name and its int8 instruction sets from /proc/cpuinfo, fastest first, and lpt's route."""
    import lpt.native

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
                       "flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_tile amx_int8\n\nprocessor\t: 1\n")
    where = benchmark.machine(str(cpuinfo))
    assert where["cpu"] == "Intel(R) Xeon(R) Processor"
    assert where["int8 instructions"] == "amx_int8 avx512_vnni avx2"
    expected_route = (lpt.native.route() or "off") if lpt.native.available() else "off"
    assert where["lpt native route"] == expected_route
    line = f"Intel(R) Xeon(R) Processor (amx_int8 avx512_vnni avx2), lpt route {expected_route}"
    assert benchmark.machine_line(where) == line
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse2\n")
    assert benchmark.machine(str(cpuinfo))["int8 instructions"] == "unknown"
    assert benchmark.machine(str(tmp_path / "missing"))["cpu"]  # not Linux: platform's name, never an error
