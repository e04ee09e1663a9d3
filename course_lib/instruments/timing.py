"""One way to read a clock, used wherever the workbook times work: synchronise the device
before starting and before stopping (CUDA kernels are asynchronous, so an unsynchronised clock
times the launch, not the work), throw warm-up calls away (first-call allocations, kernel
selection, lazy initialisation, compilation), repeat, and report the median and the best.

airbench's and nanoGPT's habit; see also https://pytorch.org/tutorials/recipes/recipes/benchmark.html
(torch.utils.benchmark does the same for single statements).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from course_lib.devices import synchronize


@dataclasses.dataclass
class Timing:
    """Seconds per call of each timed repeat (warm-up calls already thrown away)."""

    seconds: list[float]
    calls_per_repeat: int = 1
    warmup: int = 0
    result: object = None  # what the last call returned

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        """The fastest repeat: other work can only slow a repeat down, so this is the closest
        to what the hardware can do; the median describes typical speed."""
        return min(self.seconds)

    def per_second(self, amount: float, *, best: bool = False) -> float:
        """`amount` (images, FLOPs ...) per call turned into a rate."""
        seconds = self.best if best else self.median
        return amount / seconds if seconds > 0 else float("inf")


def now(device=None) -> float:
    """The clock (seconds, time.perf_counter) read once `device`'s queued work has finished: the
    one way the workbook reads a clock. For an interval that cannot be one call (the data wait of a
    step, which a generator hands back and forth), read it at both ends."""
    synchronize(device)  # note: a CPU-GPU sync point; CUDA/MPS kernels are asynchronous
    return time.perf_counter()


def stopwatch(work: Callable[[], object], device=None, calls: int = 1) -> tuple[float, object]:
    """Seconds per call of `calls` back-to-back calls of `work`, between two device syncs, and
    the last call's result. The building block of `time_repeats`, and the way to time a call that
    must not be repeated (the first compile, say)."""
    start = now(device)  # from an idle device, so earlier queued work is not timed
    result = None
    for _ in range(calls):
        result = work()
    return (now(device) - start) / calls, result  # the queued work finished before the clock is read


def time_repeats(work: Callable[[], object], *, repeats: int = 5, warmup: int = 1, device=None,
                 calls: int = 1) -> Timing:
    """Call `work` `warmup` times (thrown away), then time `repeats` repeats of `calls` calls each."""
    if repeats < 1 or warmup < 0 or calls < 1:
        raise ValueError(f"repeats and calls must be at least 1 and warmup at least 0, got "
                         f"repeats={repeats}, calls={calls}, warmup={warmup}")
    for _ in range(warmup):
        work()
    timed = [stopwatch(work, device, calls) for _ in range(repeats)]
    return Timing([seconds for seconds, _ in timed], calls, warmup, timed[-1][1])
