"""The results ledger: one SQLite file (stdlib `sqlite3`) that records every notebook run, training run and benchmark
with versions, hardware, parameters and metrics, so notebooks can compare results across runs and machines.

Concurrent writers (several papermill kernels at once) are safe: SQLite's WAL journal plus a busy timeout serialises the
inserts, and each insert is one short transaction.

A damaged ledger is found, not appended to: opening it runs SQLite's `PRAGMA quick_check`
(https://sqlite.org/pragma.html#pragma_quick_check) and checks the schema, and every `sqlite3` error becomes a one-line
`LedgerError` naming the file and the fix. A result is never lost to the ledger: when the database cannot be written,
`record` appends the row as one JSON line to `runs/ledger-unsaved.jsonl` beside it and warns in one line;
`workbook ledger --import-unsaved` moves those rows into a healthy ledger later.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

from course_lib.config import WorkbookError
from course_lib.machine import describe_hardware, git_commit, hardware_summary, runtime_versions
from course_lib.paths import project_root

# The runner exports these so that every kernel it starts writes into the same ledger
# and tags its rows with the run's id.
LEDGER_ENV = "WORKBOOK_LEDGER"
RUN_ID_ENV = "WORKBOOK_RUN_ID"
PROFILE_ENV = "WORKBOOK_PROFILE"
DEFAULT_PATH = Path("runs") / "ledger.sqlite"
UNSAVED_SUFFIX = "-unsaved.jsonl"  # rows the database could not take: runs/ledger-unsaved.jsonl
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
COLUMNS = ("id", "created_at", "run_id", "kind", "name", "status", "duration_seconds", "profile", "git_commit",
           "versions", "hardware", "parameters", "metrics")
_JSON_COLUMNS = ("versions", "hardware", "parameters", "metrics")
BUSY_TIMEOUT_SECONDS = 60.0  # how long a writer waits for another process's transaction
LOCK_NOTICE_SECONDS = 2.0  # after this long waiting, say why (one line on stderr)


class LedgerError(WorkbookError):
    """The ledger file cannot be opened, read or written; the message names the file and the fix."""


def unsaved_path(path: str | os.PathLike) -> Path:
    """Where rows go when the database at `path` cannot take them (runs/ledger-unsaved.jsonl)."""
    path = Path(path)
    return path.with_name(path.stem + UNSAVED_SUFFIX)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def ledger_error(path: Path, error: BaseException | str) -> LedgerError:
    """A one-line LedgerError for an sqlite3 (or OS) error on the ledger at `path`, with the fix
    that matches it."""
    reason = error if isinstance(error, str) else _first_line(error)
    lowered = reason.lower()
    if "readonly" in lowered or "read-only" in lowered or "permission denied" in lowered:
        return LedgerError(f"ledger {path} cannot be written ({reason}); make it and its folder writable, "
                           f"or point {LEDGER_ENV} at another file")
    if "not a directory" in lowered or "file exists" in lowered:
        return LedgerError(f"ledger {path} cannot be created ({reason}): a file is in the way of its folder; "
                           f"move that file, or point {LEDGER_ENV} at another path")
    if "locked" in lowered or "busy" in lowered:
        return LedgerError(f"ledger {path} is locked by another process ({reason}); wait for it to finish, "
                           "or stop the process that holds it")
    free = _free_bytes(path)
    if "disk is full" in lowered or "no space" in lowered or ("i/o error" in lowered and 0 <= free < DISK_FULL_BYTES):
        left = f", {free / 1e6:.1f} MB free" if free >= 0 else ""
        return LedgerError(f"ledger {path}: no space left on the disk holding it ({reason}{left}); free some space "
                           "and run again (a full disk does not damage the ledger: `workbook ledger --check` says ok "
                           "once there is room)")
    if "unable to open" in lowered:
        return LedgerError(f"ledger {path} cannot be opened ({reason}); check the folder exists and is writable, "
                           f"or point {LEDGER_ENV} at another file")
    quoted = shlex.quote(str(path))
    return LedgerError(f"ledger {path} is damaged ({reason}); move it aside (mv {quoted} {quoted}.damaged) so a new "
                       f"one is started; `workbook ledger --check --path {quoted}` reports its state")


# A full disk reaches SQLite as "disk I/O error" when its WAL index (ledger.sqlite-shm) cannot grow:
# with under this many bytes free on the ledger's disk such an error is the disk, not damage.
DISK_FULL_BYTES = 1 << 20  # 1 MiB


def _free_bytes(path: Path) -> int:
    """Bytes free to this user on the disk holding `path` (its nearest existing folder); -1 if unknown."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return -1


def default_path() -> Path:
    return Path(os.environ.get(LEDGER_ENV) or project_root() / DEFAULT_PATH)


def _json(value) -> str:
    return json.dumps(value if value is not None else {}, sort_keys=True, default=str)


class Ledger:
    """Append-only table of results. `record(...)` writes a row; `rows(...)` reads them back;
    `check()` says whether the file is a sound ledger. Opening a damaged, unreadable or foreign
    file raises LedgerError (one line: the file and the fix)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else default_path()
        self.read_only = ""  # the URI options a ledger that cannot be written is read with ("": read-write)
        try:
            existing = self.path.is_file() and self.path.stat().st_size > 0
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as connection:
                if existing:  # check before writing anything: a damaged or foreign file is left as it is
                    self._check(connection)
                connection.execute("PRAGMA journal_mode=WAL")
                connection.executescript(_SCHEMA)
        except (sqlite3.Error, OSError) as error:
            if not self._open_read_only(error):
                raise ledger_error(self.path, error) from None

    def _open_read_only(self, error: BaseException) -> bool:
        """A ledger that exists but cannot be written (a read-only checkout or mount) is opened for reading, so
        `ledger`, `claims` and `compare` still read it (issue 49, point 14); a write then fails in one line
        and its row goes to the unsaved file where it can. Plain read-only first (it sees rows still in the
        write-ahead log), else `immutable` (no -shm file can be made beside it)."""
        lowered = str(error).lower()
        if not (self.path.is_file() and self.path.stat().st_size > 0) or not any(
                word in lowered for word in ("readonly", "read-only", "permission denied", "unable to open")):
            return False
        for options in ("mode=ro", "mode=ro&immutable=1"):
            self.read_only = options
            try:
                with closing(self._connect()) as connection:
                    self._check(connection)
                return True
            except sqlite3.OperationalError:
                continue
            except sqlite3.Error as failure:
                raise ledger_error(self.path, failure) from None
        return False

    def _connect(self, timeout: float = BUSY_TIMEOUT_SECONDS) -> sqlite3.Connection:
        # A busy timeout: a writer waits for another's transaction instead of failing.
        if self.read_only:
            connection = sqlite3.connect(f"{self.path.absolute().as_uri()}?{self.read_only}", uri=True, timeout=timeout)
        else:
            connection = sqlite3.connect(self.path, timeout=timeout)
        connection.row_factory = sqlite3.Row
        return connection

    def check(self) -> int:
        """SQLite's quick_check (every page and index readable, cheap: no cross-checks) and the
        results table with its columns; returns the number of rows, raises LedgerError."""
        try:
            with closing(self._connect()) as connection:
                return self._check(connection)
        except sqlite3.Error as error:
            raise ledger_error(self.path, error) from None

    def _check(self, connection: sqlite3.Connection) -> int:
        verdict = [row[0] for row in connection.execute("PRAGMA quick_check")]
        if verdict != ["ok"]:
            first = next((line for line in "\n".join(verdict).splitlines() if not line.startswith("***")), verdict[0])
            raise ledger_error(self.path, f"quick_check: {first.strip()[:200]}")
        columns = {row[1] for row in connection.execute("PRAGMA table_info(results)")}
        missing = [column for column in COLUMNS if column not in columns]
        if missing:
            raise LedgerError(f"{self.path} is not a workbook ledger (its results table lacks {', '.join(missing)}); "
                              f"point {LEDGER_ENV} or --path at the ledger, or move this file aside")
        return connection.execute("SELECT COUNT(*) FROM results").fetchone()[0]

    def record(self, kind: str, name: str, *, status: str = "ok", duration_seconds: float | None = None,
               parameters: dict | None = None, metrics: dict | None = None, profile: str | None = None,
               run_id: str | None = None) -> int | None:
        """Write one row and return its id. Versions, hardware and git commit are filled in.
        When the database cannot take it (damaged, read-only, full, locked past the timeout) the
        row goes to `unsaved_path(self.path)` instead, with a one-line warning, and None is returned."""
        row = make_row(kind, name, status=status, duration_seconds=duration_seconds, parameters=parameters,
                       metrics=metrics, profile=profile, run_id=run_id)
        try:
            return self.insert(row)
        except LedgerError as error:
            return keep_unsaved(self.path, row, error)

    def insert(self, row: dict, *, check: bool = True) -> int:
        """Insert a row made by `make_row` (or read back from the unsaved file); LedgerError when
        the database is damaged (quick_check first, so nothing is appended to a broken file) or
        cannot be written."""
        def attempt(timeout: float) -> int:
            with closing(self._connect(timeout)) as connection, connection:
                if check:
                    self._check(connection)
                cursor = connection.execute(
                    f"INSERT INTO results ({', '.join(COLUMNS[1:])}) VALUES ({','.join('?' * (len(COLUMNS) - 1))})",
                    [_json(row[c]) if c in _JSON_COLUMNS else row[c] for c in COLUMNS[1:]])
                return cursor.lastrowid

        try:
            return self._patiently(attempt)
        except sqlite3.Error as error:
            raise ledger_error(self.path, error) from None

    def _patiently(self, attempt):
        """`attempt(timeout)` with a short busy timeout first; if another process holds the lock, say
        so in one line on stderr, then wait out the rest of BUSY_TIMEOUT_SECONDS (not a minute of silence)."""
        try:
            return attempt(LOCK_NOTICE_SECONDS)
        except sqlite3.OperationalError as error:
            if "locked" not in str(error).lower() and "busy" not in str(error).lower():
                raise
            print(f"workbook: ledger {self.path} is locked by another process; waiting up to "
                  f"{BUSY_TIMEOUT_SECONDS - LOCK_NOTICE_SECONDS:.0f} s more for it", file=sys.stderr, flush=True)
            return attempt(BUSY_TIMEOUT_SECONDS - LOCK_NOTICE_SECONDS)

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
        try:
            with closing(self._connect()) as connection:
                records = [dict(r) for r in connection.execute(query, args)]
        except sqlite3.Error as error:
            raise ledger_error(self.path, error) from None
        for record in records:
            for column in _JSON_COLUMNS:
                try:
                    record[column] = json.loads(record[column])
                except (TypeError, ValueError):
                    raise ledger_error(self.path, f"row {record['id']} has unreadable {column}") from None
        return records

    def dataframe(self, **filters):
        """The rows as a pandas DataFrame, metrics flattened into `metric.<name>` columns."""
        import pandas as pd

        flat = []
        for record in self.rows(**filters):
            item = {k: v for k, v in record.items() if k not in _JSON_COLUMNS}
            item["torch"] = record["versions"].get("torch")
            item["hardware"] = describe_hardware(record["hardware"]) if record["hardware"] else None
            item.update({f"metric.{k}": v for k, v in record["metrics"].items()})
            flat.append(item)
        return pd.DataFrame(flat)

    def import_unsaved(self) -> int:
        """Move the rows of `unsaved_path(self.path)` into this ledger (one transaction) and
        remove the file; returns how many. The file is renamed first, so rows that other processes
        append meanwhile start a new file instead of being lost."""
        source = unsaved_path(self.path)
        if not source.exists():
            return 0
        claimed = source.with_name(f"{source.name}.importing-{os.getpid()}")
        os.replace(source, claimed)
        try:
            rows = read_unsaved(claimed)
            try:
                with closing(self._connect()) as connection, connection:
                    self._check(connection)
                    connection.executemany(
                        f"INSERT INTO results ({', '.join(COLUMNS[1:])}) VALUES ({','.join('?' * (len(COLUMNS) - 1))})",
                        [[_json(row[c]) if c in _JSON_COLUMNS else row.get(c) for c in COLUMNS[1:]] for row in rows])
            except sqlite3.Error as error:
                raise ledger_error(self.path, error) from None
        except BaseException:
            _append_back(claimed, source)
            raise
        claimed.unlink()
        return len(rows)


def _append_back(claimed: Path, source: Path) -> None:
    """Return the claimed rows to the unsaved file (after any appended meanwhile): nothing is lost."""
    with open(source, "ab") as handle:
        handle.write(claimed.read_bytes())
    claimed.unlink()


def make_row(kind: str, name: str, *, status: str = "ok", duration_seconds: float | None = None,
             parameters: dict | None = None, metrics: dict | None = None, profile: str | None = None,
             run_id: str | None = None) -> dict:
    """One ledger row as a dict of the table's columns (no id), versions, hardware and commit filled in."""
    return {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run_id": run_id or os.environ.get(RUN_ID_ENV),
        "kind": kind, "name": name, "status": status, "duration_seconds": duration_seconds,
        "profile": profile or os.environ.get(PROFILE_ENV),
        "git_commit": git_commit(),
        "versions": runtime_versions(), "hardware": hardware_summary(),
        "parameters": parameters or {}, "metrics": metrics or {},
    }


def keep_unsaved(path: Path, row: dict, error: BaseException) -> None:
    """Append `row` to the unsaved-rows file beside the ledger and warn in one line on stderr.
    If even that file cannot be written, the warning carries the row itself."""
    target = unsaved_path(path)
    line = json.dumps(row, sort_keys=True, default=str)
    reason = _first_line(error)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8") as handle:  # one write of one line: appends do not interleave
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as write_error:
        print(f"workbook: warning: {reason}; {target} cannot be written either ({_first_line(write_error)}); "
              f"the row: {line}", file=sys.stderr, flush=True)
        return None
    print(f"workbook: warning: the {row['kind']} row {row['name']!r} was not recorded in the ledger and was kept in "
          f"{target} ({reason})", file=sys.stderr, flush=True)
    return None


def read_unsaved(path: Path) -> list[dict]:
    """The rows of an unsaved-rows file; a line cut short by a crash is named, not skipped."""
    rows = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except ValueError:
            raise LedgerError(f"{path} line {number} is not a JSON row ({text[:60]!r}); fix or delete that line "
                              "and import again") from None
        missing = [c for c in COLUMNS[1:] if c not in row and c not in ("run_id", "duration_seconds", "profile",
                                                                         "git_commit")]
        if missing:
            raise LedgerError(f"{path} line {number} lacks {', '.join(missing)}; fix or delete that line "
                              "and import again")
        rows.append(row)
    return rows


def check_writable(path: str | os.PathLike | None = None) -> Path:
    """Before a long run: the ledger (default: the runner's or runs/ledger.sqlite) opens, passes
    quick_check and takes a write (a probe row inside a transaction that is rolled back).
    Returns its path; raises LedgerError with the fix, so a run fails in its first second
    instead of at its end."""
    book = Ledger(path)

    def attempt(timeout: float) -> None:
        with closing(book._connect(timeout)) as connection:
            connection.execute("BEGIN IMMEDIATE")  # takes the write lock, as an insert would
            connection.execute("INSERT INTO results (created_at, kind, name, status, versions, hardware, parameters,"
                               " metrics) VALUES ('', 'probe', 'probe', 'ok', '{}', '{}', '{}', '{}')")
            connection.rollback()

    try:
        book._patiently(attempt)
    except sqlite3.Error as error:
        raise ledger_error(book.path, error) from None
    return book.path


def record(kind: str, name: str, **kwargs) -> int | None:
    """Write one row to the default ledger (the runner's, when inside a run). Never raises for
    the ledger's sake: a row the database cannot take is kept in the unsaved-rows file (see
    `Ledger.record`)."""
    path = default_path()
    try:
        book = Ledger(path)
    except LedgerError as error:
        return keep_unsaved(path, make_row(kind, name, **kwargs), error)
    return book.record(kind, name, **kwargs)


RUNNING = "(running)"  # rows_by_notebook: rows written after the last finished notebook


def rows_by_notebook(rows: list[dict]) -> dict[str, list[dict]]:
    """The run's ledger rows grouped by the notebook that wrote them. Notebooks run one after
    another and the runner records a notebook's own row (kind "notebook") when it ends, so every
    other row belongs to the first notebook row after it (ids increase with time); rows after the
    last notebook row belong to the notebook still running."""
    groups: dict[str, list[dict]] = {}
    pending: list[dict] = []
    for row in sorted(rows, key=lambda r: r["id"]):
        if row["kind"] == "notebook":
            groups.setdefault(row["name"], []).extend(pending)
            pending = []
        else:
            pending.append(row)
    if pending:
        groups[RUNNING] = pending
    return groups


LIST_ITEMS_SHOWN = 4  # a per-epoch list in `workbook ledger` shows this many values, then its length


def format_rows(records: list[dict], width: int | None = None) -> str:
    """A plain-text table for `workbook ledger`, numbers to their meaningful digits (`meaningful`).
    The metrics column is never cut: it wraps, metric by metric, onto lines under itself to fit
    `width` columns (default: the terminal's, 120 when piped)."""
    from course_lib.data.scan import printable  # a name or value holding a newline or escape must not forge a line

    header = ("id", "created_at", "run_id", "kind", "name", "status", "seconds", "metrics")
    lines, metrics = [], []
    for r in records:
        metrics.append([printable(f"{k}={meaningful(v)}") for k, v in sorted(r["metrics"].items())])
        seconds = "" if r["duration_seconds"] is None else f"{r['duration_seconds']:.1f}"
        lines.append(tuple(printable(cell) for cell in (r["id"], r["created_at"], r["run_id"] or "", r["kind"],
                                                        r["name"], r["status"], seconds)))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header[:-1])]
    indent = sum(widths) + 2 * len(widths)  # where the metrics column starts
    room = max(40, (width or shutil.get_terminal_size((120, 24)).columns) - indent)
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  metrics"]
    for line, items in zip(lines, metrics):
        first, *rest = _wrap(items, room) or [""]
        out.append(("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + first).rstrip())
        out += [" " * indent + more for more in rest]
    return "\n".join(out)


def _wrap(items: list[str], room: int) -> list[str]:
    """`items` joined with ", " into lines of at most `room` characters (a longer item has a line of its own)."""
    wrapped = []
    for item in items:
        if wrapped and len(wrapped[-1]) + 2 + len(item) + 1 <= room:  # + 1: the comma a wrapped line ends with
            wrapped[-1] += ", " + item
        else:
            if wrapped:
                wrapped[-1] += ","
            wrapped.append(item)
    return wrapped


def meaningful(value) -> str:
    """A metric as a reader wants it: 3 significant digits (0.953, 12.3, 1.2e-05), whole numbers from 100
    on (1234 images/s; 3 significant again from a million), integers as they are; lists and dicts item by
    item, a long list shortened, a list of records (a speed run's curve) by its length and first keys
    (`workbook ledger --json` prints them whole)."""
    if isinstance(value, bool) or not isinstance(value, (float, list, tuple, dict)):
        return str(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, dict) for item in value):
        keys = list(value[0])
        return f"[{len(value)} rows of {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {meaningful(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        shown = [meaningful(v) for v in value[:LIST_ITEMS_SHOWN]]
        more = f", ... ({len(value)} values)" if len(value) > LIST_ITEMS_SHOWN else ""
        return "[" + ", ".join(shown) + more + "]"
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.0f}" if 100 <= abs(value) < 1e6 else f"{value:.3g}"
