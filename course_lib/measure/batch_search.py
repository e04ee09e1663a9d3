"""The largest batch that fits: double the batch until a step runs out of memory (or over a cap), then
binary-search between the last that fitted and the first that did not.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from course_lib.instruments.peak_memory import is_out_of_memory, release_memory


@dataclass
class BatchSearch:
    """Result of `find_largest_batch`: the largest batch that fitted and every trial."""
    largest_batch: int
    trials: list[dict] = field(default_factory=list)


def find_largest_batch(step: Callable[[int], int | None], start: int = 1, max_batch: int = 4096,
                       memory_cap_bytes: int | None = None, device=None, multiple_of: int = 1) -> BatchSearch:
    """Double the batch until `step(batch)` (one training step, returning its peak bytes or None) runs out of memory
    or over `memory_cap_bytes`, then bisect to a `multiple_of` (8 suits tensor cores), releasing memory after an OOM."""
    trials: list[dict] = []

    def fits(batch_size: int) -> bool:
        reason, peak = "fits", None
        try:
            peak = step(batch_size)
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            reason = "out of memory"
        if reason != "fits":
            release_memory(device)  # after the except block: the traceback no longer pins tensors
        elif memory_cap_bytes is not None and peak is not None and peak > memory_cap_bytes:
            reason = "over memory cap"
        trials.append({"batch_size": batch_size, "fits": reason == "fits", "peak_bytes": peak, "reason": reason})
        return reason == "fits"

    good, bad = 0, None
    batch_size = max(1, start)
    while batch_size <= max_batch:
        if not fits(batch_size):
            bad = batch_size
            break
        good = batch_size
        batch_size *= 2
    if bad is None:  # max_batch reached without a failure
        bad = max_batch + 1
        if good < max_batch:
            if fits(max_batch):
                good = max_batch
            else:
                bad = max_batch
    while bad - good > multiple_of:
        middle = (good + bad) // 2 // multiple_of * multiple_of
        if middle <= good:
            break
        if fits(middle):
            good = middle
        else:
            bad = middle
    return BatchSearch(largest_batch=good, trials=trials)
