"""The suite's time budget per kind of test (issue 46), checked at the end of every whole run.

`tests/time_budget.json` holds, per kind (`notebook`, `browser`, `torchrun`, `slow`, `unit`), the seconds its tests took
(setup, call and teardown summed, as `conftest.time_table` prints them) in one measured run on a named machine, with
the seconds that machine took for `calibrate()`'s fixed workload. A run on another machine scales the budget by its
own `calibrate()` time: a machine half as fast gets twice the seconds. A kind fails when it takes more than
`MARGIN` times its scaled budget. Only a run that executed (nearly) all of a kind's tests, with as many pytest-xdist
workers as the budget was measured with, is checked: `pytest tests/test_x.py` says "not checked" and why.
`WORKBOOK_TEST_BUDGET=off` prints the table without failing (for a machine known to be loaded).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

BUDGET_FILE = Path(__file__).with_name("time_budget.json")
MARGIN = 1.5  # a kind fails past 1.5x its budget scaled to this machine
COMPLETE = 0.9  # a kind is checked when at least 90% of the tests its budget counted ran
OFF_ENV = "WORKBOOK_TEST_BUDGET"


def calibrate(repeats: int = 3) -> float:
    """Seconds for a fixed piece of the suite's kind of work, the fastest of `repeats` each: a pure-Python loop (the
    interpreter's speed: papermill, pandas) and a small convolution's forward and backward passes on the CPU (torch's
    speed with its default threads, as the tests train), plus a fresh Python process importing torch (the start-up
    every kernel, `workbook` command and torchrun worker pays: about 40% of the suite, and it does not scale with the
    other two; a calibration without it gave a machine with twice the compute half of every budget, and its torchrun
    kind, mostly start-ups, went over)."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.Conv2d(3, 32, 3, padding=1)
    images = torch.randn(32, 3, 32, 32)
    compute = start_up = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        sum(i * i for i in range(1_200_000))
        for _ in range(40):
            layer(images).square().mean().backward()
        compute = min(compute, time.perf_counter() - started)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, stdin=subprocess.DEVNULL)
        start_up = min(start_up, time.perf_counter() - started)
    return compute + start_up


def load(path: Path = BUDGET_FILE) -> dict:
    return json.loads(path.read_text())


def checkable(tests: dict, budget: dict, workers: int) -> bool:
    """Whether `check` would check a kind: the budget's number of workers, and (nearly) all of some kind's tests ran.
    Only then is `calibrate()` worth its seconds (three fresh processes importing torch)."""
    return workers == budget["workers"] and any(tests.get(kind, 0) >= COMPLETE * recorded["tests"]
                                                for kind, recorded in budget["kinds"].items())


def check(by_kind: dict, tests: dict, budget: dict, seconds_here: float | None, workers: int) -> tuple[list[str], bool]:
    """(the lines of the budget table, whether a checked kind went past `MARGIN` times its scaled budget).

    `by_kind`/`tests`: this run's seconds and tests per kind; `seconds_here`: this machine's `calibrate()`, None when
    nothing is `checkable` (the budgets are then shown unscaled)."""
    scale = 1.0 if seconds_here is None else seconds_here / budget["calibration_seconds"]
    lines = [f"time budget (tests/time_budget.json: {budget['machine']}, {budget['workers']} worker(s); "
             + ("this machine not calibrated: nothing to check; budgets unscaled" if seconds_here is None else
                f"this machine's calibration took {seconds_here:.3f} s, {scale:.2f}x its, so each budget x {scale:.2f}")
             + f"; a kind fails past {MARGIN:g}x):"]
    if workers != budget["workers"]:
        return lines + [f"  not checked: this run has {workers} worker(s), the budget was measured with "
                        f"{budget['workers']}"], False
    failed = False
    for kind, recorded in budget["kinds"].items():
        allowed, took, ran = recorded["seconds"] * scale, by_kind.get(kind, 0.0), tests.get(kind, 0)
        if ran < COMPLETE * recorded["tests"]:
            verdict = f"not checked: {ran} of its {recorded['tests']} tests ran"
        elif took > MARGIN * allowed:
            verdict, failed = f"OVER: {took / allowed:.2f}x its budget", True
        else:
            verdict = f"ok: {took / allowed:.2f}x its budget"
        lines.append(f"  {kind:<9} {took:8.1f} s of {allowed:8.1f} s  {verdict}")
    return lines, failed


def enforced() -> bool:
    """Whether an over-budget kind fails the run (`WORKBOOK_TEST_BUDGET=off` only prints)."""
    return os.environ.get(OFF_ENV, "").strip().lower() != "off"


def heaviest_files_first(files: list[tuple[str, list[str]]], budget: dict) -> list[str]:
    """The test files, as (name, the kind of each of its tests), heaviest first by the seconds the budget's run gave
    each kind per test; files of the same weight keep their order. `make test` hands them to its pytest-xdist
    processes in this order (--dist loadfile --no-loadscope-reorder): the longest work starts first, and the last
    files to start are the short ones, so both processes end close together (alphabetical order put the notebooks,
    the README's commands and the solutions, a third of the suite, last)."""
    per_test = {kind: recorded["seconds"] / recorded["tests"] for kind, recorded in budget["kinds"].items()}
    weight = {name: sum(per_test.get(kind, 0.0) for kind in kinds) for name, kinds in files}
    return sorted(weight, key=lambda name: -weight[name])
