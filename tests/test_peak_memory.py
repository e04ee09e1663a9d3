"""The peak-memory counters (`instruments.peak_memory`): the CPU tracker counts live tensor bytes, a
step's peak excludes what was live before it, and out-of-memory errors are told from other errors."""
import pytest
import torch

from course_lib.instruments import peak_memory


def test_cpu_peak_tracker_counts_live_tensors():
    with peak_memory.cpu_peak_tracker() as tracked:
        first = torch.ones(1_000_000)  # 4 MB
        second = first * 2  # 4 MB more
        del first, second
    assert tracked["peak_bytes"] == pytest.approx(8_000_000, rel=0.01)


def test_peak_bytes_during_counts_the_step_only():
    kept = torch.ones(1_000_000)  # live before the step: not counted
    peak = peak_memory.peak_bytes_during(lambda: (kept * 2) * 3, "cpu")  # two 4 MB temporaries at once
    assert peak == pytest.approx(8_000_000, rel=0.01)


def test_is_out_of_memory_tells_allocation_failures_from_other_errors():
    assert peak_memory.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert peak_memory.is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] can't allocate 8 GB"))
    assert peak_memory.is_out_of_memory(MemoryError())
    assert not peak_memory.is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_the_cpu_peak_kind_is_the_process_peak_rss():
    assert peak_memory.peak_memory_kind("cpu") == "process_peak_rss"
    assert peak_memory.peak_memory_bytes("cpu") > 0  # only grows: never below what this process holds now
