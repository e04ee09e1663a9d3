import json
import multiprocessing

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


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite"
    ledger.Ledger(path)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
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
