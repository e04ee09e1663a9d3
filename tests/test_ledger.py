import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest
from conftest import ROOT

from course_lib import cli, ledger


def test_record_and_read_back(isolated_ledger):
    book = ledger.Ledger()
    assert book.path == isolated_ledger
    row_id = book.record("bench", "decode", duration_seconds=1.5, parameters={"size": 64},
                         metrics={"images_per_second": 123.4}, profile="smoke")
    rows = book.rows()
    assert [r["id"] for r in rows] == [row_id]
    row = rows[0]
    assert row["kind"] == "bench" and row["metrics"] == {"images_per_second": 123.4}
    assert row["parameters"] == {"size": 64} and row["profile"] == "smoke"
    assert row["versions"]["torch"] and row["versions"]["python"]
    assert row["hardware"]["logical_cores"] >= 1


def test_run_id_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(ledger.RUN_ID_ENV, "run-42")
    ledger.record("train", "resnet18")
    assert ledger.Ledger().rows(run_id="run-42")[0]["name"] == "resnet18"


def test_filters_and_dataframe():
    book = ledger.Ledger()
    book.record("bench", "a", metrics={"x": 1})
    book.record("train", "b", metrics={"top1": 0.5})
    assert [r["name"] for r in book.rows(kind="train")] == ["b"]
    frame = book.dataframe(kind="train")
    assert frame.loc[0, "metric.top1"] == 0.5


def _write_rows(args):
    path, worker, count = args
    book = ledger.Ledger(path)
    for index in range(count):
        book.record("bench", f"w{worker}", metrics={"index": index})


@pytest.mark.slow
def test_concurrent_writers_lose_nothing(tmp_path):
    """Four processes append at once. They are forked from multiprocessing's fork server, which imports this module
    (and with it course_lib and torch) once: with four spawned interpreters, each importing them, the test process
    took 26 s of CPU, 11 s so."""
    path = tmp_path / "shared.sqlite"
    ledger.Ledger(path)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    with context.Pool(4) as pool:
        pool.map(_write_rows, [(str(path), worker, 25) for worker in range(4)])
    rows = ledger.Ledger(path).rows()
    assert len(rows) == 100
    for worker in range(4):
        assert sorted(r["metrics"]["index"] for r in rows if r["name"] == f"w{worker}") == list(range(25))


def test_ledger_cli_table_and_json(capsys):
    ledger.record("notebook", "00_setup_check.ipynb", duration_seconds=2.0, metrics={"images_per_second": 10.0})
    assert cli.main(["ledger"]) == 0
    out = capsys.readouterr().out
    assert "00_setup_check.ipynb" in out and "images_per_second=10" in out
    assert cli.main(["ledger", "--json", "--kind", "notebook"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "00_setup_check.ipynb"


# --- a damaged ledger: found before anything is appended, one line, nothing lost -------------

def damage_a_middle_page(path):
    """Change one leaf page's cell count: SQLite still opens the file and accepts inserts, but
    quick_check sees the damage (the 'appends silently' case)."""
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything into the main file
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    middle = (len(data) // page_size) // 2 * page_size
    data[middle + 3:middle + 5] = (5).to_bytes(2, "big")
    path.write_bytes(bytes(data))


def filled_ledger(path, rows=200):
    book = ledger.Ledger(path)
    row = ledger.make_row("bench", "filler", metrics={"padding": "x" * 300})
    for _ in range(rows):
        book.insert(row)
    return book


def test_a_file_that_is_not_a_database_is_one_line_naming_the_file_and_the_fix(tmp_path, capsys):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"this is not an sqlite file\n" * 200)
    with pytest.raises(ledger.LedgerError, match="is damaged") as caught:
        ledger.Ledger(path)
    message = str(caught.value)
    assert str(path) in message and "move it aside" in message and "workbook ledger --check" in message
    assert "\n" not in message
    assert cli.main(["ledger", "--path", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is damaged" in err


def test_damage_in_the_middle_is_found_and_nothing_is_appended(tmp_path, capsys, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    filled_ledger(path)
    damage_a_middle_page(path)
    # The fault: plain SQLite appends to this file without a word.
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes(path.read_bytes())
    with closing(sqlite3.connect(copy)) as connection, connection:
        connection.execute("INSERT INTO results (created_at, kind, name, status, versions, hardware, parameters,"
                           " metrics) VALUES ('', 'k', 'n', 'ok', '{}', '{}', '{}', '{}')")
    before = path.read_bytes()
    with pytest.raises(ledger.LedgerError, match="quick_check"):
        ledger.Ledger(path)
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    assert ledger.record("train", "resnet18", metrics={"top1": 0.9}) is None
    assert path.read_bytes() == before  # not one byte written into the damaged file
    kept = ledger.read_unsaved(ledger.unsaved_path(path))
    assert [(row["kind"], row["name"], row["metrics"]) for row in kept] == [("train", "resnet18", {"top1": 0.9})]
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "ledger-unsaved.jsonl" in warning[0] and "resnet18" in warning[0]


def test_ledger_check_reports_the_state_and_unsaved_rows_are_imported_later(tmp_path, capsys, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    ledger.record("bench", "decode")
    assert cli.main(["ledger", "--check"]) == 0
    assert capsys.readouterr().out.strip() == f"ledger {path}: ok (quick_check passed, 1 rows)"

    path.write_bytes(b"\x00garbage" * 100)
    ledger.record("train", "kept-1", metrics={"top1": 0.5})
    ledger.record("train", "kept-2")
    capsys.readouterr()
    assert cli.main(["ledger", "--check"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert "is damaged" in out[0] and "move it aside" in out[0]
    assert "holds 2 row(s)" in out[1] and "--import-unsaved" in out[1]

    path.rename(tmp_path / "ledger.sqlite.damaged")  # the fix the message gives
    assert cli.main(["ledger", "--import-unsaved"]) == 0
    assert "imported 2 row(s)" in capsys.readouterr().out
    assert not ledger.unsaved_path(path).exists()
    rows = ledger.Ledger(path).rows()
    assert [r["name"] for r in rows] == ["kept-2", "kept-1"] and rows[1]["metrics"] == {"top1": 0.5}
    assert cli.main(["ledger", "--check"]) == 0


def test_a_failed_import_returns_the_rows_to_the_unsaved_file(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger.keep_unsaved(path, ledger.make_row("train", "precious"), RuntimeError("simulated"))
    unsaved = ledger.unsaved_path(path)
    with open(unsaved, "a") as handle:
        handle.write('{"kind": "train", "na')  # a line cut short by a crash
    content = unsaved.read_bytes()
    with pytest.raises(ledger.LedgerError, match="line 2 is not a JSON row"):
        ledger.Ledger(path).import_unsaved()
    assert unsaved.read_bytes() == content
    assert ledger.Ledger(path).rows() == []  # all or nothing
    assert not list(tmp_path.glob("*.importing-*"))  # no claimed copy left behind


def test_a_foreign_sqlite_file_is_refused_and_left_unchanged(tmp_path):
    path = tmp_path / "other.sqlite"
    with closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("CREATE TABLE results (id INTEGER, score REAL)")
    before = path.read_bytes()
    with pytest.raises(ledger.LedgerError, match="not a workbook ledger.*lacks created_at"):
        ledger.Ledger(path)
    assert path.read_bytes() == before


def test_check_writable_fails_before_a_run_and_leaves_no_row(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    assert ledger.check_writable(path) == path
    assert ledger.Ledger(path).rows() == []  # the probe row was rolled back
    # A read-only database (opened read-only: as root, file permissions would not stop the write).
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda target, **kwargs: connect(
        f"file:{target}?mode=ro", uri=True, **kwargs))
    with pytest.raises(ledger.LedgerError, match="cannot be written.*writable") as caught:
        ledger.check_writable(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    monkeypatch.undo()
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(ledger.LedgerError, match="is damaged"):
        ledger.check_writable(path)


def test_when_even_the_unsaved_file_cannot_be_written_the_row_is_printed(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the ledger's folder should be")
    ledger.keep_unsaved(blocker / "ledger.sqlite", ledger.make_row("train", "last-resort", metrics={"top1": 0.7}),
                        RuntimeError("simulated"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and '"name": "last-resort"' in err[0] and '"top1": 0.7' in err[0]


@pytest.mark.slow
def test_workbook_train_with_a_damaged_ledger_loses_nothing_and_prints_no_traceback(tmp_path):
    """Either the engine refuses at start (ledger.check_writable: one line, exit 2, nothing
    trained) or it trains and keeps the row beside the ledger (one warning line, exit 0); never
    a traceback after training, never a lost result."""
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"\x00damaged" * 200)
    env = {**os.environ, ledger.LEDGER_ENV: str(path), "PYTHONPATH": str(ROOT)}
    process = subprocess.run([sys.executable, "-m", "course_lib", "train", "--profile", "smoke", "--no-progress",
                              "-p", "model=test_resnet", "-p", "max_steps=1", "-p", "image_size=16",
                              "-p", f"output_dir={tmp_path / 'checkpoints'}"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in process.stderr, process.stderr
    ledger_lines = [line for line in process.stderr.splitlines() if str(path) in line or "ledger" in line]
    assert len(ledger_lines) == 1, process.stderr
    if process.returncode == 2:  # refused before training
        assert "is damaged" in ledger_lines[0] and not (tmp_path / "checkpoints" / "last.pt").exists()
    else:
        assert process.returncode == 0, process.stderr
        kept = ledger.read_unsaved(ledger.unsaved_path(path))
        assert [(row["kind"], row["name"], row["status"]) for row in kept] == [("train", "test_resnet", "ok")]
        assert "val_top1" in kept[0]["metrics"] or "train_loss" in kept[0]["metrics"]


def test_a_file_in_the_way_of_the_ledger_folder_is_named(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("a file where the folder should be")
    with pytest.raises(ledger.LedgerError, match="a file is in the way of its folder"):
        ledger.Ledger(blocker / "ledger.sqlite")


@pytest.mark.parametrize("sqlite_says", ["disk I/O error", "database or disk is full"])
def test_a_full_disk_is_told_apart_from_damage(tmp_path, monkeypatch, capsys, sqlite_says):
    """A full disk reaches SQLite as "disk I/O error" (its WAL index cannot grow) or SQLITE_FULL: the
    message says so, without the "damaged ... move it aside" advice, and the row is not lost."""
    import collections
    import sqlite3

    path = tmp_path / "ledger.sqlite"
    ledger.Ledger(path).record("train", "before")
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(ledger.shutil, "disk_usage", lambda folder: usage(10**9, 10**9, 0))

    def full(*args, **kwargs):
        raise sqlite3.OperationalError(sqlite_says)

    monkeypatch.setattr(ledger.sqlite3, "connect", full)
    with pytest.raises(ledger.LedgerError) as refused:
        ledger.check_writable(path)
    message = str(refused.value)
    assert message.startswith(f"ledger {path}: no space left on the disk holding it ({sqlite_says}, 0.0 MB free); "
                              "free some space and run again") and "\n" not in message
    assert "damaged" not in message.replace("does not damage", "") and "move it aside" not in message
    monkeypatch.setattr(ledger.shutil, "disk_usage", lambda folder: usage(10**9, 0, 10**9))
    if sqlite_says == "disk I/O error":  # with room on the disk, an I/O error is the file's own
        with pytest.raises(ledger.LedgerError, match="is damaged"):
            ledger.check_writable(path)
    monkeypatch.undo()
    assert [row["name"] for row in ledger.Ledger(path).rows()] == ["before"]  # the full disk damaged nothing


@pytest.mark.slow
def test_a_locked_ledger_says_so_within_seconds_then_waits(tmp_path, monkeypatch, capsys):
    import threading
    import time

    path = tmp_path / "ledger.sqlite"
    ledger.Ledger(path).record("train", "before")
    monkeypatch.setattr(ledger, "BUSY_TIMEOUT_SECONDS", 3.0)
    monkeypatch.setattr(ledger, "LOCK_NOTICE_SECONDS", 0.5)
    holder = sqlite3.connect(path, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process's long write transaction
    started = time.perf_counter()
    with pytest.raises(ledger.LedgerError, match="is locked by another process"):
        ledger.check_writable(path)
    assert 2.5 < time.perf_counter() - started < 10
    assert capsys.readouterr().err.strip() == (f"workbook: ledger {path} is locked by another process; "
                                               "waiting up to 2 s more for it")
    threading.Timer(1.0, holder.rollback).start()  # released while the writer waits: the row goes in
    assert ledger.Ledger(path).insert(ledger.make_row("train", "after"), check=False) is not None
    assert "waiting up to 2 s more" in capsys.readouterr().err
    holder.close()
    assert [row["name"] for row in ledger.Ledger(path).rows()] == ["after", "before"]


@pytest.mark.parametrize("value, text", [(0.953412, "0.953"), (12.3456, "12.3"), (1234.56, "1235"), (3.0, "3"),
                                         (1.234e-5, "1.23e-05"), (2.5e9, "2.5e+09"), (7, "7"), (True, "True"),
                                         ("cpu", "cpu"), ([0.91234, 0.95678], "[0.912, 0.957]"),
                                         ([1.5] * 6, "[1.5, 1.5, 1.5, 1.5, ... (6 values)]"),
                                         ({"a": 0.123456}, "{a: 0.123}"), (float("nan"), "nan"),
                                         # a speed run's 21-point curve: its length and keys, not 672 characters
                                         ([{"seconds": 1.5, "epoch": 0.5, "val_top1": 0.9, "val_loss": 0.3}] * 21,
                                          "[21 rows of seconds, epoch, val_top1, ...]")])
def test_metrics_are_shown_to_their_meaningful_digits(value, text):
    assert ledger.meaningful(value) == text


def test_the_metrics_column_wraps_instead_of_being_cut():
    metrics = {f"metric_{i:02d}": 0.123456789 * (i + 1) for i in range(12)}
    row = {"id": 1, "created_at": "2026-12-02T10:00:00", "run_id": "r", "kind": "train", "name": "n",
           "status": "ok", "duration_seconds": 2.0, "metrics": metrics}
    lines = ledger.format_rows([row], width=120).splitlines()
    assert lines[0].split() == ["id", "created_at", "run_id", "kind", "name", "status", "seconds", "metrics"]
    column = lines[0].index("metrics")
    assert len(lines) > 2 and all(len(line) <= 120 for line in lines)
    assert all(line[:column].strip() == "" for line in lines[2:])  # continuation lines sit under the column
    shown = " ".join(line[column:] for line in lines[1:])
    assert all(f"{name}={ledger.meaningful(value)}" in shown for name, value in metrics.items())
    assert "metric_11=1.48" in shown


def test_a_name_holding_control_characters_cannot_forge_a_ledger_line():
    """Issue 49 point 10: names and metrics reach `workbook ledger`'s table as escapes, one row one line."""
    row = {"id": 1, "created_at": "2026-12-02T10:00:00", "run_id": "r", "kind": "train",
           "name": "real\n2  2026-12-02T10:00:01  r  train  forged  ok", "status": "ok\x1b[2J",
           "duration_seconds": 2.0, "metrics": {"note\r": "a\nb"}}
    lines = ledger.format_rows([row], width=200).splitlines()
    assert len(lines) == 2 and "\x1b" not in lines[1] and "real\\n2" in lines[1] and "ok\\x1b[2J" in lines[1]
    assert "note\\r" in lines[1] and "a\\nb" in lines[1]


def test_a_ledger_on_a_read_only_mount_is_read_and_a_write_is_one_line(small_disk, capsys):
    """Issue 49 point 14: on a read-only checkout `ledger`, `claims` and `compare` refused, because the ledger
    was opened for writing even to be read. A real tmpfs, remounted read-only after two rows were written."""
    import subprocess

    from course_lib import cli

    path = small_disk / "ledger.sqlite"
    book = ledger.Ledger(path)
    book.record("train", "first", metrics={"val_top1": 0.5})
    book.record("train", "second", metrics={"val_top1": 0.6})
    done = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only here: {done.stderr.strip()}")
    try:
        read = ledger.Ledger(path)
        assert read.read_only and [row["name"] for row in read.rows()] == ["second", "first"]
        assert cli.main(["ledger", "--path", str(path)]) == 0
        assert "second" in capsys.readouterr().out
        assert cli.main(["claims", "--path", str(path)]) == 0
        assert read.record("train", "third") is None  # not written, said in one line, nothing raised
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "third" in err[0] and "cannot be written" in err[0]
        with pytest.raises(ledger.LedgerError, match="cannot be written"):
            ledger.check_writable(path)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], capture_output=True)
