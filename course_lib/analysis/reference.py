"""Reference results: the full-length run of a chapter, measured once on a named machine and committed
as data, shown beside the reader's own run and never passed off as it (as uvadlc's notebooks load
expensive results instead of recomputing them).

A reference is one JSON file per notebook, `results/reference/<hardware>/<NN>.json`, made from a
finished `workbook run` by `workbook reference save RUN_ID`: the claims that run recorded in the
ledger (value, interval, verdict, how it was measured), with the hardware, the library versions, the
notebook's parameters (its seeds among them), the date, the exact command that reproduces it, and how long
the notebook and each of its cells took (`analysis.expected_time` says so before a reader's long cell).
`claims.show` puts the reference's columns beside the reader's, and `workbook claims` lists each
reference under the reader's own measurement, apart from the counts (both in `analysis.claims`,
which reads this module; this module never reads claims).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from pathlib import Path

from course_lib import paths, run_summary
from course_lib.config import WorkbookError
from course_lib.data.build_lock import DISK_FULL, disk_full

REFERENCE_FOLDER = Path("results") / "reference"  # under the project root


class ReferenceResultError(WorkbookError):
    """A reference cannot be made or read: one line naming the run or file and the fix."""


@dataclasses.dataclass
class Reference:
    notebook: str  # "07": the chapter's number, as the claims' `notebook` field names it
    hardware: str  # machine.describe_hardware() of the machine that measured it
    date: str  # when the run finished (the ledger rows' time, UTC)
    profile: str  # the profile it ran in (smoke runs are refused: not evidence)
    command: str  # the command that reproduces it
    parameters: dict  # the notebook's parameters in that run (seeds, epochs ...)
    versions: dict  # python, torch, torchvision, timm ... of that run
    run_id: str
    claims: list[dict]  # one per claim: key, measured, low, high, unit, verdict, reason
    seconds: float | None = None  # the notebook's whole run (None: saved before durations were kept)
    cell_seconds: dict = dataclasses.field(default_factory=dict)  # cell id -> seconds (papermill's per-cell duration)
    cell_sources: dict = dataclasses.field(default_factory=dict)  # cell id -> `source_digest` of its code
    data: str = ""  # the name of the data the notebook ran on ("eurosat"; what the times were measured on)
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


def cell_times(notebook_path: Path) -> tuple[dict, dict, str]:
    """({cell id: papermill's seconds}, {cell id: `source_digest`}, the data's name its data line printed, never the
    machine's folder) of an executed notebook; ({}, {}, "") when it is missing or unreadable."""
    try:
        cells = json.loads(Path(notebook_path).read_text()).get("cells", [])
    except (OSError, ValueError):
        return {}, {}, ""
    seconds = {cell["id"]: round(cell["metadata"]["papermill"]["duration"], 3) for cell in cells
               if cell.get("id") and isinstance(cell.get("metadata", {}).get("papermill", {}).get("duration"), (int, float))}
    line = next((line for cell in cells for output in cell.get("outputs", []) if output.get("name") == "stdout"
                 for line in "".join(output.get("text", "")).splitlines() if line.startswith("data: ")), "")
    sources = {cell["id"]: source_digest("".join(cell.get("source", ""))) for cell in cells if cell.get("id") in seconds}
    return seconds, sources, re.split(r" \(|,", line[len("data: "):], maxsplit=1)[0].strip() if line else ""


def from_run(run_id: str, book=None, runs: Path | None = None) -> list[Reference]:
    """One Reference per notebook of run `run_id` that recorded claims (the ledger's rows, summary.json's
    parameters); ReferenceResultError for a run unknown, unfinished, of the smoke profile or without claims."""
    from course_lib import ledger, machine

    run_folder = (runs or paths.resolve_path("runs")) / run_id
    summary_path = run_folder / "summary.json"
    if not summary_path.exists():
        raise ReferenceResultError(f"no run {run_id}: {summary_path} does not exist; `workbook run` prints the run's id "
                             "(its folder under runs/)")
    try:
        summary = run_summary.read(run_folder)
    except run_summary.SummaryError as error:
        raise ReferenceResultError(str(error)) from None
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
        cells, sources, data = cell_times(run_folder / result["notebook"])
        references.append(Reference(
            notebook=number, hardware=first["parameters"].get("hardware_line") or machine.describe_hardware(
                first["hardware"]), date=mine[0]["created_at"], profile=summary["profile"],
            command=_command(summary["profile"], result["notebook"], parameters), parameters=parameters,
            versions=first.get("versions") or {}, run_id=run_id, claims=claims,
            seconds=result.get("duration_seconds"), cell_seconds=cells, cell_sources=sources, data=data))
    if not references:
        raise ReferenceResultError(f"run {run_id} has no notebook that finished and recorded claims")
    return references


LONG_PROFILE = "reference"  # the profile whose result a quick pass never replaces


def target_path(reference: Reference, root: Path | None = None) -> Path:
    """`<root>/<hardware slug>/<notebook>.json`, or for a quick pass (cpu, gpu) where that holds the long
    `reference`-profile run, `<slug>/<profile>/<notebook>.json`: the long run stays the chapter's reference, and
    the quick pass's cell times are kept where `analysis.expected_time` reads them."""
    main = (root or folder()) / hardware_slug(reference.hardware) / f"{reference.notebook}.json"
    if reference.profile == LONG_PROFILE or not main.exists():
        return main
    try:
        kept = load(main).profile
    except ReferenceResultError:  # a damaged file is replaced, as before
        return main
    return main.parent / reference.profile / main.name if kept == LONG_PROFILE else main


def save(reference: Reference, root: Path | None = None) -> Path:
    """Write `reference` where `target_path` says (replacing the one there), through a temporary file renamed
    into place. Returns the path."""
    target = target_path(reference, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {k: v for k, v in dataclasses.asdict(reference).items() if k != "path"}
    text = json.dumps(record, indent=1, ensure_ascii=False, default=str) + "\n"
    try:  # a full disk leaves the file that was there, and no temporary beside it
        paths.write_atomically(target, text)
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        raise disk_full(target, len(text.encode()), f"the reference {target.name}",
                        "free some space, then run `workbook reference save` again") from None
    return target


# The type each field of a reference file must have (a file with another is refused where it is read).
FIELD_TYPES = {"notebook": str, "hardware": str, "date": str, "profile": str, "command": str, "parameters": dict,
               "versions": dict, "run_id": str, "claims": list, "seconds": (int, float, type(None)),
               "cell_seconds": dict, "cell_sources": dict, "data": str}


def source_digest(source: str) -> str:
    """12 hex digits naming a cell's code: how a kernel that is not told the cell's id (papermill's) finds it."""
    return hashlib.sha1(source.strip().encode()).hexdigest()[:12]


def load(path: Path) -> Reference:
    try:
        record = json.loads(Path(path).read_text())
        if not isinstance(record, dict):
            raise ValueError(f"it holds a JSON {type(record).__name__}, not an object")
        wrong = [name for name, kind in FIELD_TYPES.items() if name in record and not isinstance(record[name], kind)]
        if wrong or not all(isinstance(item, dict) for item in record.get("claims", [])):
            raise ValueError(f"wrong type for {', '.join(wrong) or 'claims (each must be an object)'}")
        return Reference(**record, path=Path(path))
    except (OSError, ValueError, TypeError) as error:
        raise ReferenceResultError(f"reference {path} cannot be read ({error}); restore it from git "
                             "(`git checkout -- results/reference`) or make it again") from None


def load_all(paths) -> list[Reference]:
    """The references at `paths` that read; each that does not is one warning line naming it, and is left
    out, so one damaged file never stops a run, the scoreboard or the docs (issue 49, point 5)."""
    found = []
    for path in paths:
        try:
            found.append(load(path))
        except ReferenceResultError as error:
            print(f"workbook: warning: {error}; left out", file=sys.stderr)
    return found


def find(notebook: str, hardware: str | None = None, root: Path | None = None) -> Reference | None:
    """The committed reference of `notebook` ("07"): the one measured on `hardware` (this machine's line
    when None) when there is one, else the newest on any machine; None when none is committed."""
    from course_lib import machine

    found = load_all(sorted((root or folder()).glob(f"*/{notebook}.json")))
    if not found:
        return None
    hardware = hardware or machine.describe_hardware()
    same = [item for item in found if item.hardware == hardware]
    return max(same or found, key=lambda item: item.date)
