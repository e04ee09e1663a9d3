"""A run's `summary.json` (what `workbook run` writes into runs/<id>/), read and checked in one place for
every reader: the run report, the docs site, `workbook compare` and `workbook reference save`. A file cut
short, of another shape or with fields of the wrong type is one `SummaryError` line naming the file and
what to do, never a traceback in the middle of a page (issue 49, point 13).
"""
from __future__ import annotations

import json
from pathlib import Path

from course_lib.config import WorkbookError

FILE = "summary.json"


class SummaryError(WorkbookError):
    """A summary.json that cannot be used: one line naming it and the fix."""


def _problem(summary) -> str | None:
    """What is wrong with a parsed summary.json, or None."""
    if not isinstance(summary, dict):
        return f"it holds a JSON {type(summary).__name__}, not an object"
    missing = [key for key in ("run_id", "profile", "results") if key not in summary]
    if missing:
        return f"it lacks {', '.join(missing)}"
    if not isinstance(summary["run_id"], str) or not isinstance(summary["profile"], str):
        return "its run_id and profile must be text"
    results = summary["results"]
    if not isinstance(results, list) or not all(isinstance(item, dict) and isinstance(item.get("notebook"), str)
                                                for item in results):
        return "its results must be a list of objects, each naming its notebook"
    not_run = summary.get("not_run", [])
    if not isinstance(not_run, list) or not all(isinstance(name, str) for name in not_run):
        return "its not_run must be a list of notebook names"
    return None


def read(folder: str | Path) -> dict:
    """The checked summary of the run in `folder`; SummaryError (one line) when it is missing or unusable."""
    path = Path(folder) / FILE
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise SummaryError(f"no run in {folder}: it holds no {FILE}; `ls runs/` lists the runs, `workbook run` "
                           "makes one") from None
    except (OSError, ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise SummaryError(f"{path} cannot be read ({type(error).__name__}: {str(error).splitlines()[0][:120]}), "
                           f"e.g. cut short by a full disk or a killed run; the ledger still has the run's rows "
                           f"(`workbook ledger --run {Path(folder).name}`), or rerun the notebooks") from None
    problem = _problem(summary)
    if problem:
        raise SummaryError(f"{path} is not a run summary ({problem}); rerun the notebooks, or restore the file")
    return summary


def read_or_empty(folder: str | Path) -> dict:
    """The checked summary, or {} when it is missing or unusable (for readers that have another source:
    the ledger's rows of the run, a site that still builds)."""
    try:
        return read(folder)
    except SummaryError:
        return {}
