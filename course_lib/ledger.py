"""The results ledger: one SQLite file (stdlib `sqlite3`) that records every notebook run,
training run and benchmark with versions, hardware, parameters and metrics, so notebooks
can compare results across runs and machines.

Concurrent writers (several papermill kernels at once) are safe: SQLite's WAL journal plus
a busy timeout serialises the inserts, and each insert is one short transaction.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path

from course_lib import devices
from course_lib.paths import project_root

# The runner exports these so that every kernel it starts writes into the same ledger
# and tags its rows with the run's id.
LEDGER_ENV = "WORKBOOK_LEDGER"
RUN_ID_ENV = "WORKBOOK_RUN_ID"
PROFILE_ENV = "WORKBOOK_PROFILE"
DEFAULT_PATH = Path("runs") / "ledger.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,          -- UTC, ISO 8601
    run_id TEXT,                       -- the runner's run id, or NULL outside a run
    kind TEXT NOT NULL,                -- notebook | train | bench | eval | ...
    name TEXT NOT NULL,                -- notebook file, benchmark name, model ...
    status TEXT NOT NULL,              -- ok | failed | skipped
    duration_seconds REAL,
    profile TEXT,
    git_commit TEXT,
    versions TEXT NOT NULL,            -- JSON: python, torch, cuda, driver ...
    hardware TEXT NOT NULL,            -- JSON: cpu, cores, gpus ...
    parameters TEXT NOT NULL,          -- JSON
    metrics TEXT NOT NULL              -- JSON: images_per_second, peak_memory_bytes, top1 ...
);
CREATE INDEX IF NOT EXISTS results_kind_name ON results (kind, name);
"""


def default_path() -> Path:
    return Path(os.environ.get(LEDGER_ENV) or project_root() / DEFAULT_PATH)


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=project_root(),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def runtime_versions() -> dict:
    """Versions that decide speed and behaviour: python, torch and its CUDA/cuDNN, driver."""
    import torch
    import torchvision

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": None,
    }
    try:
        import timm

        versions["timm"] = timm.__version__
    except ImportError:
        versions["timm"] = None
    if torch.cuda.is_available():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            versions["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    return versions


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def hardware_summary() -> dict:
    """A short description of the machine, stored with every row (the full inventory is
    `course_lib.measure.peak`)."""
    import psutil
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "physical_cores": devices.machine_cores()[0],
        "logical_cores": devices.machine_cores()[1],
        "ram_bytes": psutil.virtual_memory().total,
        "gpus": gpus,
    }


def describe_hardware(hardware: dict | None = None) -> str:
    """One line naming the machine, to print next to every absolute number."""
    hardware = hardware or hardware_summary()
    cores = f"{hardware['physical_cores']} cores"
    gpus = ", ".join(hardware["gpus"]) or "no GPU"
    return f"{hardware['cpu']} ({cores}), {gpus}"


def _json(value) -> str:
    return json.dumps(value if value is not None else {}, sort_keys=True, default=str)


class Ledger:
    """Append-only table of results. `record(...)` writes a row; `rows(...)` reads them back."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as connection:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        # 60 s busy timeout: a writer waits for another's transaction instead of failing.
        connection = sqlite3.connect(self.path, timeout=60)
        connection.row_factory = sqlite3.Row
        return connection

    def record(self, kind: str, name: str, *, status: str = "ok", duration_seconds: float | None = None,
               parameters: dict | None = None, metrics: dict | None = None, profile: str | None = None,
               run_id: str | None = None) -> int:
        """Write one row and return its id. Versions, hardware and git commit are filled in."""
        row = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            run_id or os.environ.get(RUN_ID_ENV),
            kind, name, status, duration_seconds,
            profile or os.environ.get(PROFILE_ENV),
            git_commit(),
            _json(runtime_versions()), _json(hardware_summary()), _json(parameters), _json(metrics),
        )
        with closing(self._connect()) as connection, connection:
            cursor = connection.execute(
                "INSERT INTO results (created_at, run_id, kind, name, status, duration_seconds, profile,"
                " git_commit, versions, hardware, parameters, metrics) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", row)
            return cursor.lastrowid

    def rows(self, kind: str | None = None, name: str | None = None, run_id: str | None = None,
             limit: int | None = None) -> list[dict]:
        """Rows newest first, JSON columns decoded."""
        where, args = [], []
        for column, value in (("kind", kind), ("name", name), ("run_id", run_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        query = "SELECT * FROM results" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
        if limit:
            query += f" LIMIT {int(limit)}"
        with closing(self._connect()) as connection:
            records = [dict(r) for r in connection.execute(query, args)]
        for record in records:
            for column in ("versions", "hardware", "parameters", "metrics"):
                record[column] = json.loads(record[column])
        return records

    def dataframe(self, **filters):
        """The rows as a pandas DataFrame, metrics flattened into `metric.<name>` columns."""
        import pandas as pd

        flat = []
        for record in self.rows(**filters):
            item = {k: v for k, v in record.items() if k not in ("versions", "hardware", "parameters", "metrics")}
            item["torch"] = record["versions"].get("torch")
            item["hardware"] = describe_hardware(record["hardware"]) if record["hardware"] else None
            item.update({f"metric.{k}": v for k, v in record["metrics"].items()})
            flat.append(item)
        return pd.DataFrame(flat)


def record(kind: str, name: str, **kwargs) -> int:
    """Write one row to the default ledger (the runner's, when inside a run)."""
    return Ledger().record(kind, name, **kwargs)


def format_rows(records: list[dict]) -> str:
    """A plain-text table for `workbook ledger`."""
    header = ("id", "created_at", "run_id", "kind", "name", "status", "seconds", "metrics")
    lines = []
    for r in records:
        metrics = ", ".join(f"{k}={_short(v)}" for k, v in sorted(r["metrics"].items()))
        seconds = "" if r["duration_seconds"] is None else f"{r['duration_seconds']:.1f}"
        lines.append((str(r["id"]), r["created_at"], r["run_id"] or "", r["kind"], r["name"], r["status"],
                      seconds, metrics[:80]))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
