"""Reference results: the full-length run of a chapter, measured once on a named machine and committed
as data, shown beside the reader's own run and never passed off as it (as uvadlc's notebooks load
expensive results instead of recomputing them).

A reference is one JSON file per notebook, `results/reference/<hardware>/<NN>.json`, made from a
finished `workbook run` by `workbook reference save RUN_ID`: the claims that run recorded in the
ledger (value, interval, verdict, how it was measured), with the hardware, the library versions, the
notebook's parameters (its seeds among them), the date, and the exact command that reproduces it.
`claims.show` puts the reference's columns beside the reader's, and `workbook claims` lists each
reference under the reader's own measurement, apart from the counts (both in `analysis.claims`,
which reads this module; this module never reads claims).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

from course_lib import paths
from course_lib.config import WorkbookError

REFERENCE_FOLDER = Path("results") / "reference"  # under the project root


class ReferenceResultError(WorkbookError):
    """A reference cannot be made or read: one line naming the run or file and the fix."""


@dataclasses.dataclass
class Reference:
    notebook: str  # "07": the chapter's number, as the claims' `notebook` field names it
    hardware: str  # ledger.describe_hardware() of the machine that measured it
    date: str  # when the run finished (the ledger rows' time, UTC)
    profile: str  # the profile it ran in (smoke runs are refused: not evidence)
    command: str  # the command that reproduces it
    parameters: dict  # the notebook's parameters in that run (seeds, epochs ...)
    versions: dict  # python, torch, torchvision, timm ... of that run
    run_id: str
    claims: list[dict]  # one per claim: key, measured, low, high, unit, verdict, reason
    path: Path | None = None

    def claim(self, key: str) -> dict | None:
        return next((item for item in self.claims if item["key"] == key), None)

    def line(self) -> str:
        """One line saying whose figures these are: the machine, the date and how to reproduce them."""
        return (f"reference (not your run): {self.hardware}, profile {self.profile}, {self.date}; "
                f"reproduce with `{self.command}`")


def folder() -> Path:
    return paths.project_root() / REFERENCE_FOLDER


def hardware_slug(hardware: str) -> str:
    """A folder name for a hardware line: "AMD EPYC (2 cores), no GPU" -> "amd-epyc-2-cores-no-gpu"."""
    return re.sub(r"[^a-z0-9]+", "-", hardware.lower()).strip("-") or "unknown"


def _command(profile: str, notebook_file: str, parameters: dict) -> str:
    options = " ".join(f"-p {name}={value}" for name, value in sorted(parameters.items()) if name != "profile")
    return " ".join(part for part in ("workbook run", f"--profile {profile}", f"--only {notebook_file[:2]}", options)
                    if part)


def from_run(run_id: str, book=None, runs: Path | None = None) -> list[Reference]:
    """One Reference per notebook of run `run_id` that recorded claims: its claim rows from the ledger
    and its parameters from `runs/<run_id>/summary.json`. ReferenceResultError when the run is unknown,
    unfinished, in the smoke profile or recorded no claim."""
    from course_lib import ledger

    summary_path = (runs or paths.resolve_path("runs")) / run_id / "summary.json"
    try:
        summary = json.loads(summary_path.read_text())
    except FileNotFoundError:
        raise ReferenceResultError(f"no run {run_id}: {summary_path} does not exist; `workbook run` prints the run's id "
                             "(its folder under runs/)") from None
    except (OSError, ValueError) as error:
        raise ReferenceResultError(f"cannot read {summary_path} ({error}); run the notebooks again") from None
    if summary.get("profile") == "smoke":
        raise ReferenceResultError(f"run {run_id} is a smoke-profile run: a check that the notebooks run, not evidence; "
                             "make a reference from a cpu or gpu run")
    rows = (book or ledger.Ledger()).rows(kind="claim", run_id=run_id)
    if not rows:
        raise ReferenceResultError(f"run {run_id} recorded no claims in the ledger; was it run with another "
                             f"{ledger.LEDGER_ENV}?")
    references = []
    for result in summary.get("results", []):
        if result.get("status") != "ok":
            continue
        number = result["notebook"][:2]
        mine = [row for row in rows if row["metrics"].get("notebook") == number]
        if not mine:
            continue
        newest = {}
        for row in mine:  # newest first: the last figure the notebook showed for each claim
            newest.setdefault(row["name"], row)
        claims = [{"key": key, **{field: row["metrics"].get(field) for field in
                                  ("statement", "source", "claimed", "unit", "measured", "low", "high", "verdict",
                                   "reason")}}
                  for key, row in sorted(newest.items())]
        first = mine[-1]
        parameters = result.get("parameters") or {}
        references.append(Reference(
            notebook=number, hardware=first["parameters"].get("hardware_line") or ledger.describe_hardware(
                first["hardware"]), date=mine[0]["created_at"], profile=summary["profile"],
            command=_command(summary["profile"], result["notebook"], parameters), parameters=parameters,
            versions=first.get("versions") or {}, run_id=run_id, claims=claims))
    if not references:
        raise ReferenceResultError(f"run {run_id} has no notebook that finished and recorded claims")
    return references


def save(reference: Reference, root: Path | None = None) -> Path:
    """Write `reference` to `<root>/<hardware slug>/<notebook>.json` (replacing the one there), through
    a temporary file renamed into place. Returns the path."""
    target = (root or folder()) / hardware_slug(reference.hardware) / f"{reference.notebook}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {k: v for k, v in dataclasses.asdict(reference).items() if k != "path"}
    temporary = target.with_suffix(f".json.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(record, indent=1, ensure_ascii=False, default=str) + "\n")
    os.replace(temporary, target)
    return target


def load(path: Path) -> Reference:
    try:
        record = json.loads(Path(path).read_text())
        return Reference(**record, path=Path(path))
    except (OSError, ValueError, TypeError) as error:
        raise ReferenceResultError(f"reference {path} cannot be read ({error}); restore it from git "
                             "(`git checkout -- results/reference`) or make it again") from None


def find(notebook: str, hardware: str | None = None, root: Path | None = None) -> Reference | None:
    """The committed reference of `notebook` ("07"): the one measured on `hardware` (this machine's line
    when None) when there is one, else the newest on any machine; None when none is committed."""
    from course_lib import ledger

    found = [load(path) for path in sorted((root or folder()).glob(f"*/{notebook}.json"))]
    if not found:
        return None
    hardware = hardware or ledger.describe_hardware()
    same = [item for item in found if item.hardware == hardware]
    return max(same or found, key=lambda item: item.date)
