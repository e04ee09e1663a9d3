"""How long a notebook, and each of its long cells, took on the machine that made its committed reference,
said before it runs: a reader who runs a chapter as written in JupyterLab (the `cpu` profile) knows what
the next cell will cost, and how to pick `smoke` instead.

The times are the reference's (`analysis.reference`: papermill's duration of every cell, by cell id, and
the notebook's whole run). Every chapter's setup (`chapters.setup.ChapterSetup`) calls `announce`, which
prints the notebook's expected time as its first line and, inside a kernel, registers an IPython
`pre_run_cell` hook: before a cell that took `LONG_CELL_SECONDS` or more there, it prints that cell's
time. A cell is found by its id, which JupyterLab sends with it (the notebooks keep their ids: nbstripout
--keep-id), or by its code's digest where the client sends no id (papermill, under `workbook run`), so
the hook needs no notebook name. A profile with no reference of its own says so in one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from course_lib.analysis import reference

LONG_CELL_SECONDS = 60.0
SMOKE_ADVICE = 'profile = "smoke" in the parameters cell runs the notebook in under a minute'
QUICK_PROFILES = ("smoke", "rehearsal")  # CI-sized: under a minute, nothing to announce but that


def duration(seconds: float) -> str:
    """"45 s", "6 min 29 s", "1 h 12 min"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass
class Timings:
    """The committed references of one profile: each cell id's seconds and the reference it came from."""

    profile: str
    cells: dict = field(default_factory=dict)  # cell id, and its code's digest -> (seconds, Reference)
    notebooks: dict = field(default_factory=dict)  # "07" -> Reference (with its seconds)

    @classmethod
    def load(cls, profile: str, root=None) -> Timings:
        from course_lib import machine  # here, not above: it imports torch

        timings = cls(profile)
        here = machine.describe_hardware()
        base = Path(root) if root else reference.folder()
        # the chapters' references, and the quick passes kept beside a long one (`reference.target_path`)
        found = reference.load_all(sorted(base.glob("*/*.json")) + sorted(base.glob(f"*/{profile}/*.json")))
        # this machine's reference first, then the newest: the times a reader's machine is likeliest to match
        for item in sorted(found, key=lambda item: (item.hardware == here, item.date)):
            if item.profile != profile or item.seconds is None:
                continue
            timings.notebooks[item.notebook] = item
            for cell_id, seconds in item.cell_seconds.items():
                timings.cells[cell_id] = (seconds, item)
                if cell_id in item.cell_sources:
                    timings.cells[item.cell_sources[cell_id]] = (seconds, item)
        return timings

    def _find(self, cell_id: str | None, source: str | None) -> tuple[float, object]:
        for key in (cell_id, reference.source_digest(source) if source else None):
            if key and key in self.cells:
                return self.cells[key]
        return 0.0, None

    def notebook_of(self, cell_id: str | None, source: str | None = None):
        return self._find(cell_id, source)[1]

    def cell_line(self, cell_id: str | None, source: str | None = None) -> str | None:
        """The line printed before a cell (found by its id, else its code) that took LONG_CELL_SECONDS or more
        on the reference's machine, else None."""
        seconds, item = self._find(cell_id, source)
        if item is None or seconds < LONG_CELL_SECONDS:
            return None
        return (f"expected: this cell took {duration(seconds)} in the {self.profile} profile on {item.hardware} "
                f"({item.date[:10]}); {SMOKE_ADVICE}")

    def notebook_line(self, cell_id: str | None, source: str | None = None) -> str:
        """The notebook's first line: its whole time on the reference's machine, or that none is measured."""
        item = self.notebook_of(cell_id, source)
        if item is None:
            return (f"expected time: none measured for the {self.profile} profile on a committed reference "
                    f"(the README's chapter table gives cpu times); {SMOKE_ADVICE}")
        on = f" on {item.data}" if item.data else ""
        return (f"expected time: about {duration(item.seconds)} in the {self.profile} profile{on}, measured on "
                f"{item.hardware} ({item.date[:10]}; reference run {item.run_id}); {SMOKE_ADVICE}")


_hooked: dict = {}  # the kernel's hook, once: {"timings": Timings, "callback": function}


def current_cell() -> tuple[str | None, str | None]:
    """(id, code) of the cell running now: the id as JupyterLab sends it (`cellId`; papermill sends none),
    the code from IPython's input history; (None, None) outside a kernel."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        kernel = getattr(shell, "kernel", None)
        if kernel is None:
            return None, None
        cell_id = kernel.get_parent().get("metadata", {}).get("cellId")
        history = shell.history_manager.input_hist_raw
        return cell_id, history[-1] if history else None
    except Exception:  # a kernel without a parent message or a history
        return None, None


def announce(profile: str, root=None) -> str:
    """Print (and return) the running notebook's expected time in `profile`; inside a kernel, say so before every
    long cell too (one hook per kernel, replaced when the profile changes)."""
    if profile in QUICK_PROFILES:
        line = f"expected time: under a minute ({profile} profile)"
        print(line)
        return line
    timings = Timings.load(profile, root)
    line = timings.notebook_line(*current_cell())
    print(line)
    _hook(timings)
    return line


def _hook(timings: Timings) -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    if _hooked.get("callback") is not None:
        shell.events.unregister("pre_run_cell", _hooked["callback"])

    def before_cell(info) -> None:
        line = timings.cell_line(getattr(info, "cell_id", None), getattr(info, "raw_cell", None))
        if line:
            print(line)

    shell.events.register("pre_run_cell", before_cell)
    _hooked.update(timings=timings, callback=before_cell)
