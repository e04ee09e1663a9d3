"""The one timing helper: warm-up calls thrown away, repeats, median and best, seconds per call."""
import itertools

import pytest

from course_lib.instruments import timing


def test_warmup_is_thrown_away_and_each_repeat_times_its_calls(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(ticks)))
    calls = []
    result = timing.time_repeats(lambda: calls.append(1) or len(calls), repeats=3, warmup=2, calls=4)
    assert len(calls) == 2 + 3 * 4
    # Each repeat reads the clock twice (one tick apart) around 4 calls: 1/4 s per call.
    assert result.seconds == [0.25, 0.25, 0.25]
    assert result.result == 14 and result.warmup == 2 and result.calls_per_repeat == 4


def test_median_best_and_rate():
    result = timing.Timing([3.0, 1.0, 2.0, 10.0, 2.5])
    assert result.median == 2.5 and result.best == 1.0
    assert result.per_second(100) == pytest.approx(40.0)
    assert result.per_second(100, best=True) == pytest.approx(100.0)


def test_stopwatch_returns_seconds_and_the_result():
    seconds, value = timing.stopwatch(lambda: sum(range(1000)), device="cpu", calls=3)
    assert value == 499500 and seconds >= 0


@pytest.mark.parametrize("kwargs", [dict(repeats=0), dict(warmup=-1), dict(calls=0)])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError, match="at least"):
        timing.time_repeats(lambda: None, **kwargs)
