"""Convergence floors: the validation top-1 below which a chapter's model is too far from converged for
the conclusions drawn from it to mean anything (issue 51). A model at 46% confuses everything with
everything; the speed-run recipe reaches 97% on EuroSAT in minutes on 2 cores, so a chapter that analyses,
distils or prunes a model does so on one near that. The floors hold for EuroSAT in the cpu, reference and gpu
profiles; elsewhere (the smoke profile, generated data) a chapter checks that it runs, and the check says so.

Each chapter checks its own model with `check` and prints the line, so a run's output shows the floor met
or missed beside the numbers it qualifies.
"""
from __future__ import annotations

import dataclasses

FLOOR_DATA = "eurosat"  # paths.DataChoice.name of the data the floors are set for
FLOOR_PROFILES = ("cpu", "reference", "gpu")  # resolved profiles the floors hold in (reference: the long cpu run)
# (notebook, model) -> the least validation top-1 (fraction) on EuroSAT.
FLOORS: dict[tuple[str, str], float] = {
    ("09", "the analysed model"): 0.95,  # the confusion matrix and the explorer read a trained model's mistakes
    ("10", "the last stage"): 0.95,
    ("13", "the teacher"): 0.97,  # a model worth compressing: the speed-run recipe's
    ("13", "the distilled student"): 0.90,
    ("15", "the out-of-fold models"): 0.90,  # confident learning needs probabilities of a model that knows the classes
}
# (notebook, model) -> the most points of top-1 it may lose against the model it comes from.
RELATIVE_FLOORS: dict[tuple[str, str], float] = {
    ("13", "the pruned model"): 2.0,  # after its fine-tune, against the unpruned teacher
}


@dataclasses.dataclass(frozen=True)
class FloorCheck:
    """One model against its floor: `applies` False off EuroSAT or outside the cpu/reference/gpu profiles (then `met`
    is None); `line` says which, with the numbers."""

    notebook: str
    model: str
    top1: float
    floor: float
    applies: bool
    met: bool | None
    line: str


def check(notebook: str, model: str, top1: float, data_name: str, profile: str,
          against: float | None = None) -> FloorCheck:
    """`model`'s validation `top1` (fraction) against its floor (`FLOORS`, or `RELATIVE_FLOORS` below
    `against`, the top-1 of the model it comes from), on data `data_name` in resolved `profile`."""
    key = (notebook, model)
    if key in FLOORS:
        floor, rule = FLOORS[key], f"{FLOORS[key]:.0%}"
    elif key in RELATIVE_FLOORS:
        if against is None:
            raise ValueError(f"the floor of {model} (notebook {notebook}) is relative: pass `against`, the top-1 "
                             "of the model it comes from")
        floor = against - RELATIVE_FLOORS[key] / 100
        rule = f"{RELATIVE_FLOORS[key]:g} points below {against:.1%}, {floor:.1%}"
    else:
        known = ", ".join(f"{n} {m!r}" for n, m in [*FLOORS, *RELATIVE_FLOORS])
        raise KeyError(f"no floor for notebook {notebook}'s {model!r}; the floors: {known}")
    applies = data_name == FLOOR_DATA and profile in FLOOR_PROFILES
    if not applies:
        line = (f"convergence floor of {model}: not checked here ({data_name}, {profile} profile; the floor, "
                f"{rule}, is for EuroSAT in the cpu, reference and gpu profiles): top-1 {top1:.1%}")
        return FloorCheck(notebook, model, top1, floor, False, None, line)
    met = top1 >= floor
    line = (f"convergence floor of {model}: {'met' if met else 'MISSED'}, top-1 {top1:.1%} "
            f"{'>=' if met else '<'} {rule}" + ("" if met else "; its conclusions come from a model too far from "
                                                "converged: train longer (epochs) before reading them"))
    return FloorCheck(notebook, model, top1, floor, True, met, line)
