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
