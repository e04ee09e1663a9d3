"""Comparing two runs (folders under runs/) or two ledger rows by what produced them: the parameters that
differ beside the results that differ (`compare_runs`, `compare_rows`), with Newcombe's interval for a
difference of accuracies (Newcombe 1998, Stat. Med. 17:873). `workbook compare RUN_A RUN_B` prints it;
`resolve_pair` tells runs, rows and evaluations (`analysis.comparison`) apart.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from course_lib import ledger, machine, paths, run_summary
from course_lib.analysis import statistics
from course_lib.analysis.comparison import resolve_evaluation
from course_lib.analysis.evaluation import Evaluation
from course_lib.config import WorkbookError

if TYPE_CHECKING:  # pandas is imported where it is used, to keep imports light
    import pandas as pd

# Accuracies (proportions of images) and the metric that counts the images each was measured on:
# with both, a difference gets Newcombe's interval (statistics.difference_of_proportions).
ACCURACY_IMAGES = {"top1": "images", "top5": "images", "val_top1": "val_images", "val_top5": "val_images",
                   "ema_val_top1": "val_images", "val_tta_top1": "val_images", "val top-1": "val_images",
                   "val top-1 (1 view)": "val_images"}
# A measured value stored with its own interval (a claim row: value, low, high).
VALUE_INTERVALS = {"value": ("low", "high")}
# Not compared: the row's identity, and outputs named after the run (an evaluation's saved file).
SKIPPED_PARAMETERS = ("path",)
RUN_ID_PATTERN = re.compile(r"^\d{8}-\d{6}-[a-z]+-[0-9a-f]{4}$")  # runner.new_run_id: 20260101-120000-smoke-1a2b


@dataclasses.dataclass
class Change:
    """One parameter or result that differs between A (before) and B (after): `delta` B - A for numbers, `ratio`
    of the means for repeated measurements (lists), `low`/`high` the interval of either, by `method`."""

    item: str  # what it belongs to: "run", a notebook, "03_amp.ipynb: train resnet18"
    kind: str  # parameter | result
    name: str
    before: object  # A's value; None when A has none
    after: object
    delta: float | None = None
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    method: str = ""


@dataclasses.dataclass
class RunComparison:
    """B against A, for two runs (matched notebook by notebook and row by row) or two ledger rows:
    `changes` holds only what differs; `only_before`/`only_after` name the rows without a partner."""

    before: str
    after: str
    changes: list[Change]
    only_before: list[str]
    only_after: list[str]
    level: float
    warnings: list[str] = dataclasses.field(default_factory=list)  # what makes a difference meaningless

    def table(self) -> "pd.DataFrame":
        """One row per change (item, kind, name, A, B, delta, ratio, low, high, method)."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(c) for c in self.changes],
                            columns=[f.name for f in dataclasses.fields(Change)]).rename(
            columns={"before": "A", "after": "B"})

    def to_dict(self) -> dict:
        """Plain JSON-able values (what `workbook compare RUN_A RUN_B --json` prints)."""
        return {"before": self.before, "after": self.after, "level": self.level,
                "changes": [dataclasses.asdict(c) for c in self.changes],
                "only_before": self.only_before, "only_after": self.only_after, "warnings": self.warnings}

    def format(self) -> str:
        """Text for the terminal: per item, the parameters that differ beside the results that differ."""
        lines = [f"A: {self.before}", f"B: {self.after}", *(f"warning: {warning}" for warning in self.warnings),
                 f"what differs (B - A; {self.level:.0%} intervals where the results have them)"]
        items = list(dict.fromkeys(c.item for c in self.changes))
        for item in items:
            parameters = [_change_text(c) for c in self.changes if c.item == item and c.kind == "parameter"]
            results = [_change_text(c) for c in self.changes if c.item == item and c.kind == "result"]
            left = max([len("parameters that differ")] + [len(text) for text in parameters])
            lines += ["", item, f"  {'parameters that differ'.ljust(left)} | results that differ"]
            for index in range(max(len(parameters), len(results))):
                parameter = parameters[index] if index < len(parameters) else ""
                result = results[index] if index < len(results) else ""
                lines.append(f"  {parameter.ljust(left)} | {result}".rstrip())
        if not items:
            lines.append("nothing differs")
        for label, names in (("only in A", self.only_before), ("only in B", self.only_after)):
            if names:
                lines += ["", f"{label}: {', '.join(names)}"]
        return "\n".join(lines)


def _shown(value) -> str:
    """A value as the tables print it: numbers to 4 significant digits, lists by their mean."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and _numbers(value):
        return f"mean {np.mean(value):.4g} of {len(value)}"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _change_text(change: Change) -> str:
    text = f"{change.name} {_shown(change.before)} -> {_shown(change.after)}"
    if change.delta is not None:
        text += f" ({change.delta:+.4g})"
    if change.ratio is not None:
        text += f" (x{change.ratio:.3g})"
    if change.low is not None:
        sign = "" if change.ratio is not None else "+"
        text += f" [{change.low:{sign}.3g}, {change.high:{sign}.3g}] {change.method}"
    return text


def _numbers(values) -> bool:
    return isinstance(values, list) and bool(values) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _without_run_ids(value, run_ids):
    """A value with the runs' own ids taken out, so runs/<id>/checkpoints counts as the same folder."""
    if isinstance(value, str):
        for run_id in run_ids:
            if run_id:
                value = value.replace(run_id, "<run>")
    return value


def _context(row: dict) -> dict:
    """What produced a row besides its parameters: profile, commit, machine and torch."""
    return {"profile": row.get("profile"), "git_commit": row.get("git_commit"),
            "hardware": machine.describe_hardware(row["hardware"]) if row.get("hardware") else None,
            "torch": (row.get("versions") or {}).get("torch")}


def parameter_changes(item: str, before: dict, after: dict, run_ids=()) -> list[Change]:
    """The parameters whose values differ (an absent one counts as None)."""
    changes = []
    for name in dict.fromkeys([*before, *after]):
        if name in SKIPPED_PARAMETERS:
            continue
        a, b = before.get(name), after.get(name)
        if _without_run_ids(a, run_ids) != _without_run_ids(b, run_ids):
            delta = b - a if _number(a) and _number(b) else None
            changes.append(Change(item, "parameter", name, a, b, delta=delta))
    return changes


def result_changes(item: str, before: dict, after: dict, level: float = 0.95, draws: int = 1000,
                   seed: int = 0) -> list[Change]:
    """The results (status, seconds, metrics) that differ, with Newcombe's interval for an accuracy whose image count
    the row records, a bootstrap one for a ratio of repeated measurements, and a claim's own intervals."""
    changes = []
    interval_keys = {key for pair in VALUE_INTERVALS.values() for key in pair}
    for name in dict.fromkeys([*before, *after]):
        a, b = before.get(name), after.get(name)
        if name in interval_keys and "value" in before or a == b:
            continue
        if isinstance(a, (list, dict)) and not _numbers(a) or isinstance(b, (list, dict)) and not _numbers(b):
            continue  # curves and tables: the notebooks plot them
        change = Change(item, "result", name, a, b)
        if _number(a) and _number(b):
            change.delta = b - a
            images = ACCURACY_IMAGES.get(name)
            counts = before.get(images), after.get(images)
            if images and all(_number(n) and n >= 1 for n in counts) and 0 <= a <= 1 and 0 <= b <= 1:
                found = statistics.difference_of_proportions(round(a * counts[0]), int(counts[0]),
                                                             round(b * counts[1]), int(counts[1]), level)
                change.low, change.high = found["low"], found["high"]
                change.method = f"Newcombe, {int(counts[0])} and {int(counts[1])} images"
            elif name in VALUE_INTERVALS:
                low, high = VALUE_INTERVALS[name]
                change.before = _with_interval(a, before.get(low), before.get(high))
                change.after = _with_interval(b, after.get(low), after.get(high))
        elif _numbers(a) and _numbers(b):
            change.ratio = float(np.mean(b) / np.mean(a)) if np.mean(a) else None
            if change.ratio is not None and len(a) >= 2 and len(b) >= 2:
                found = statistics.ratio_interval(b, a, level, draws=draws, seed=seed)
                change.low, change.high, change.method = found["low"], found["high"], "ratio of means, bootstrap"
        changes.append(change)
    return changes


def _with_interval(value, low, high):
    return f"{value:.4g} [{low:.4g}, {high:.4g}]" if _number(low) and _number(high) else value


def row_changes(item: str, before: dict, after: dict, level: float = 0.95, run_ids=(), context: bool = True,
                draws: int = 1000) -> list[Change]:
    """Two ledger rows: their parameters (with profile, commit, machine and torch when `context`)
    beside their results (status, seconds, metrics)."""
    parameters = [{**(_context(row) if context else {}), **row.get("parameters", {})} for row in (before, after)]
    results = [{"status": row.get("status"), "seconds": row.get("duration_seconds"), **row.get("metrics", {})}
               for row in (before, after)]
    return parameter_changes(item, *parameters, run_ids) + result_changes(item, *results, level, draws)


def _row_label(row: dict) -> str:
    return f"row {row['id']} ({row['kind']} {row['name']}, {row['created_at']}" + \
        (f", run {row['run_id']})" if row.get("run_id") else ")")


def class_set_warning(item: str, before: dict, after: dict) -> str | None:
    """A warning when two training rows learned different class sets (their metrics' `classes`, since issue 49): a
    top-1 over 3 classes and one over 8 measure different tasks, so their difference says nothing."""
    classes = [(row.get("metrics") or {}).get("classes") for row in (before, after)]
    if not all(isinstance(found, list) for found in classes) or classes[0] == classes[1]:
        return None
    return (f"{item}: A learned {len(classes[0])} classes and B {len(classes[1])}, not the same set: their accuracies "
            "measure different tasks and are not comparable")


def compare_rows(before: dict, after: dict, level: float = 0.95, draws: int = 1000) -> RunComparison:
    """Two ledger rows (`Ledger.rows` dicts), e.g. two training runs: what differs."""
    statistics._check_level(level)
    item = f"{before['kind']} {before['name']}" if (before["kind"], before["name"]) == (after["kind"], after["name"]) \
        else f"{before['kind']} {before['name']} / {after['kind']} {after['name']}"
    changes = row_changes(item, before, after, level, (before.get("run_id"), after.get("run_id")), draws=draws)
    warning = class_set_warning(item, before, after)
    return RunComparison(_row_label(before), _row_label(after), changes, [], [], level, [warning] if warning else [])


@dataclasses.dataclass
class RunRecord:
    """A run as the ledger and its folder hold it: its id, folder (None when only the ledger knows
    it), ledger rows and the notebook results of its summary.json."""

    run_id: str
    folder: Path | None
    rows: list[dict]
    results: list[dict]
    profile: str | None = None

    def label(self) -> str:
        first = next((row for row in self.rows if row.get("hardware")), {})
        where = f"{machine.describe_hardware(first['hardware'])}" if first else "no ledger rows"
        return (f"run {self.run_id} (profile {self.profile or first.get('profile') or '?'}, "
                f"commit {first.get('git_commit') or '?'}, {where})")

    def notebook_rows(self) -> dict[str, dict]:
        """Each notebook's own row (status, seconds, parameters): the ledger's, else summary.json's."""
        found = {row["name"]: row for row in sorted(self.rows, key=lambda r: r["id"]) if row["kind"] == "notebook"}
        for result in self.results:
            found.setdefault(result["notebook"], {"kind": "notebook", "name": result["notebook"],
                                                  "status": result.get("status"),
                                                  "duration_seconds": result.get("duration_seconds"),
                                                  "parameters": result.get("parameters", {}), "metrics": {}})
        return found


def find_run(reference: str, book=None) -> RunRecord | None:
    """The run `reference` names: a run folder (holding summary.json), a folder under runs/, or a run
    id the ledger has rows of; None when it names no run."""
    book = book or ledger.Ledger()
    folder = next((f for f in (Path(reference), paths.project_root() / "runs" / reference)
                   if (f / "summary.json").is_file()), None)
    summary = run_summary.read_or_empty(folder) if folder is not None else {}  # unusable: the ledger has the rows
    run_id = summary.get("run_id") or (folder.name if folder is not None else reference)
    rows = book.rows(run_id=run_id)
    if folder is None and not rows:
        return None
    return RunRecord(run_id, folder, rows, summary.get("results", []), summary.get("profile"))


def _occurrences(rows: list[dict]) -> dict[str, dict]:
    """Rows keyed "kind name", numbered "#2", "#3" ... when a name repeats (a grid's runs)."""
    counts: dict[tuple, int] = {}
    keyed = {}
    for row in sorted(rows, key=lambda r: r["id"]):
        key = (row["kind"], row["name"])
        counts[key] = counts.get(key, 0) + 1
        keyed[f"{row['kind']} {row['name']}" + (f" #{counts[key]}" if counts[key] > 1 else "")] = row
    return keyed


def compare_runs(before: RunRecord, after: RunRecord, level: float = 0.95, draws: int = 1000) -> RunComparison:
    """Two runs: their profile, commit, machine and torch, then per notebook its parameters beside its results and
    the rows it wrote, matched by kind, name and order (a grid's third training run with the third)."""
    statistics._check_level(level)
    run_ids = (before.run_id, after.run_id)
    first = [next((row for row in run.rows if row.get("hardware")), {}) for run in (before, after)]
    context = [{**_context(row), "profile": run.profile or row.get("profile")} for row, run in zip(first, (before, after))]
    changes = parameter_changes("run", *context, run_ids)
    only_before, only_after, warnings = [], [], []
    notebooks = [run.notebook_rows() for run in (before, after)]
    groups = [ledger.rows_by_notebook(run.rows) for run in (before, after)]
    for name in dict.fromkeys([*notebooks[0], *notebooks[1]]):
        if name not in notebooks[1] or name not in notebooks[0]:
            (only_before if name in notebooks[0] else only_after).append(name)
            continue
        changes += [change for change in row_changes(name, notebooks[0][name], notebooks[1][name], level, run_ids,
                                                     context=False, draws=draws)
                    if change.name != "profile"]  # every notebook's profile is the run's, shown once above
        keyed = [_occurrences(group.get(name, [])) for group in groups]
        for key in dict.fromkeys([*keyed[0], *keyed[1]]):
            if key not in keyed[0] or key not in keyed[1]:
                (only_before if key in keyed[0] else only_after).append(f"{name}: {key}")
                continue
            changes += row_changes(f"{name}: {key}", keyed[0][key], keyed[1][key], level, run_ids, context=False,
                                   draws=draws)
            warnings += filter(None, [class_set_warning(f"{name}: {key}", keyed[0][key], keyed[1][key])])
    return RunComparison(before.label(), after.label(), changes, only_before, only_after, level, warnings)


def resolve(reference: str, split: str = "val", book=None):
    """("run", RunRecord), ("row", ledger row) or ("evaluation", Evaluation) for what `workbook compare` was given,
    in that order (an eval row with its saved file is an evaluation); one FileNotFoundError line for none."""
    book = book or ledger.Ledger()
    run = find_run(reference, book)
    if run is not None:
        return "run", run
    if RUN_ID_PATTERN.match(reference):
        raise FileNotFoundError(f"no run {reference!r}: no folder runs/{reference}/ and no ledger rows of that run; "
                                "`ls runs/` lists the runs, `workbook ledger` the rows")
    if reference.isdigit():
        row = next((r for r in book.rows() if r["id"] == int(reference)), None)
        if row is not None:
            saved = row["parameters"].get("path") if row["kind"] == "eval" else None
            if saved and Path(saved).exists():
                return "evaluation", Evaluation.load(saved)
            return "row", row
    try:
        return "evaluation", resolve_evaluation(reference, split)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no evaluation {reference!r}, and no run or ledger row of that id: give two run ids (folders under "
            "runs/), two ledger row ids, or two evaluations (a saved .npz, a checkpoint .pt, an eval row's name); "
            "`ls runs/` and `workbook ledger` list them") from None


def resolve_pair(first: str, second: str, split: str = "val", book=None) -> tuple[str, object, object]:
    """(kind, A, B) for `workbook compare A B`: two runs, rows or evaluations (two row ids, one an eval row, compare
    as rows); other mixtures are one WorkbookError line."""
    book = book or ledger.Ledger()
    (kind, before), (other, after) = (resolve(reference, split, book) for reference in (first, second))
    if kind != other and {kind, other} == {"row", "evaluation"} and first.isdigit() and second.isdigit():
        rows = {row["id"]: row for row in book.rows()}
        return "row", rows[int(first)], rows[int(second)]
    if kind != other:
        named = {"run": "a run", "row": "a ledger row", "evaluation": "an evaluation"}
        raise WorkbookError(f"{first} is {named[kind]} and {second} {named[other]}: compare two runs, two ledger rows "
                            "or two evaluations")
    return kind, before, after
