"""Two runs or two ledger rows compared by what produced them: the parameters that differ beside the
results that differ, Newcombe's interval for accuracies, `workbook compare RUN_A RUN_B`, and one-line errors."""
import json

import pytest
from test_comparison import BEFORE, _evaluation

from course_lib import cli
from course_lib.analysis import run_comparison, statistics

RUN_A, RUN_B = "20260101-000000-smoke-aaaa", "20260102-000000-cpu-bbbb"


def _write_run(root, run_id, profile, epochs, val_top1, speeds, claim_value, extra_row=False):
    """A run folder as `workbook run` leaves it (summary.json) and the ledger rows its kernels wrote:
    notebook 03 trains once and states a claim, notebook 04 benchmarks a loader."""
    from course_lib import ledger

    folder = root / "runs" / run_id
    folder.mkdir(parents=True)
    results = [{"notebook": name, "status": "ok", "duration_seconds": seconds, "output": name, "html": None,
                "error": None, "parameters": {"profile": profile, "epochs": epochs}}
               for name, seconds in (("03_amp.ipynb", 10.0 * epochs), ("04_loaders.ipynb", 5.0))]
    (folder / "summary.json").write_text(json.dumps({"run_id": run_id, "profile": profile, "state": "finished",
                                                     "results": results, "not_run": []}))
    book = ledger.Ledger()
    book.record("train", "resnet18", run_id=run_id, duration_seconds=3.0 * epochs, profile=profile,
                parameters={"model": "resnet18", "epochs": epochs, "lr": 0.1,
                            "output_dir": f"runs/{run_id}/checkpoints"},
                metrics={"val_top1": val_top1, "val_images": 2000, "epoch_images_per_second": speeds,
                         "val_loss": 0.9})
    book.record("claim", "amp_speedup", run_id=run_id, profile=profile, parameters={"hardware_line": "cpu"},
                metrics={"statement": "AMP is faster", "value": claim_value, "low": claim_value - 0.1,
                         "high": claim_value + 0.1, "verdict": "holds"})
    book.record("notebook", "03_amp.ipynb", run_id=run_id, duration_seconds=10.0 * epochs, profile=profile,
                parameters={"profile": profile, "epochs": epochs})
    book.record("bench", "loader", run_id=run_id, profile=profile, metrics={"images_per_second": 900.0})
    if extra_row:
        book.record("bench", "decode", run_id=run_id, profile=profile, metrics={"images_per_second": 50.0})
    book.record("notebook", "04_loaders.ipynb", run_id=run_id, duration_seconds=5.0, profile=profile,
                parameters={"profile": profile, "epochs": epochs})
    return folder


@pytest.fixture
def two_runs(tmp_path, monkeypatch):
    from course_lib import paths

    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)  # runs/<id> is found under the project folder
    _write_run(tmp_path, RUN_A, "smoke", 1, 0.80, [100.0, 110.0, 105.0], 1.2)
    _write_run(tmp_path, RUN_B, "cpu", 3, 0.85, [200.0, 220.0, 210.0], 1.5, extra_row=True)
    return tmp_path


def test_two_runs_show_the_parameters_that_differ_beside_the_results_that_differ(two_runs):
    before, after = run_comparison.find_run(RUN_A), run_comparison.find_run(str(two_runs / "runs" / RUN_B))
    assert (before.run_id, after.run_id) == (RUN_A, RUN_B)  # by id, or by folder
    result = run_comparison.compare_runs(before, after, draws=200)
    changes = {(c.item, c.kind, c.name): c for c in result.changes}
    assert changes[("run", "parameter", "profile")].after == "cpu"
    assert ("run", "parameter", "git_commit") not in changes  # the same commit made both
    assert changes[("03_amp.ipynb", "parameter", "epochs")].delta == 2
    assert changes[("03_amp.ipynb", "result", "seconds")].delta == pytest.approx(20.0)
    assert ("04_loaders.ipynb", "result", "seconds") not in changes  # equal results are left out
    train = "03_amp.ipynb: train resnet18"
    assert changes[(train, "parameter", "epochs")].before == 1
    assert (train, "parameter", "output_dir") not in changes  # runs/<id>/checkpoints: the same folder of each run
    assert (train, "parameter", "lr") not in changes
    top1 = changes[(train, "result", "val_top1")]
    assert top1.delta == pytest.approx(0.05)
    expected = statistics.difference_of_proportions(1600, 2000, 1700, 2000)
    assert (top1.low, top1.high) == pytest.approx((expected["low"], expected["high"]))
    assert top1.low > 0 and "Newcombe" in top1.method  # 5 points on 2000 images is beyond noise
    assert (train, "result", "val_loss") not in changes
    speed = changes[(train, "result", "epoch_images_per_second")]
    assert speed.ratio == pytest.approx(2.0) and speed.low < 2.0 < speed.high and speed.delta is None
    claim = changes[("03_amp.ipynb: claim amp_speedup", "result", "value")]
    assert (claim.before, claim.after) == ("1.2 [1.1, 1.3]", "1.5 [1.4, 1.6]")
    assert result.only_after == ["04_loaders.ipynb: bench decode"] and result.only_before == []
    assert set(result.table().columns) >= {"item", "kind", "name", "A", "B", "delta", "low", "high"}
    json.dumps(result.to_dict())


def test_workbook_compare_two_run_ids(two_runs, capsys):
    assert cli.main(["compare", RUN_A, RUN_B, "--draws", "200"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith(f"A: run {RUN_A} (profile smoke")
    block = text[text.index("03_amp.ipynb: train resnet18"):]
    header, first = block.splitlines()[1:3]
    assert header.split("|")[0].strip() == "parameters that differ" and header.split("|")[1].strip() == \
        "results that differ"
    assert first.split("|")[0].strip() == "epochs 1 -> 3 (+2)"  # the parameter beside the result it produced
    assert "val_top1 0.8 -> 0.85 (+0.05) [+0.0" in block and "Newcombe, 2000 and 2000 images" in block
    assert "only in B: 04_loaders.ipynb: bench decode" in text
    assert cli.main(["compare", RUN_A, RUN_B, "--json", "--draws", "200"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"item": "run", "name": "profile", "before": "smoke", "after": "cpu"}.items() <= \
        next(c for c in report["changes"] if c["name"] == "profile").items()


def test_workbook_compare_two_ledger_rows(two_runs, capsys):
    from course_lib import ledger

    rows = [row for row in reversed(ledger.Ledger().rows(kind="train"))]
    assert cli.main(["compare", str(rows[0]["id"]), str(rows[1]["id"]), "--draws", "200"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith(f"A: row {rows[0]['id']} (train resnet18")
    assert "profile smoke -> cpu" in text and "epochs 1 -> 3 (+2)" in text and "seconds 3 -> 9 (+6)" in text
    result = run_comparison.compare_rows(rows[0], rows[1], draws=200)
    assert [c.name for c in result.changes if c.kind == "parameter"] == ["profile", "epochs"]
    saved = _evaluation("saved", BEFORE)  # an eval row with its file is an evaluation, but beside a row it is a row
    saved.save(two_runs)
    eval_row = ledger.Ledger().record("eval", "saved", parameters={"path": str(saved.path)},
                                      metrics={"top1": 0.6, "images": 10})
    assert run_comparison.resolve(str(eval_row))[0] == "evaluation"
    kind, before, after = run_comparison.resolve_pair(str(rows[0]["id"]), str(eval_row))
    assert (kind, before["kind"], after["kind"]) == ("row", "train", "eval")


def test_unknown_run_ids_and_mixed_kinds_are_one_line_errors(two_runs, tmp_path, capsys):
    assert cli.main(["compare", RUN_A, "20990101-000000-smoke-ffff"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no run '20990101-000000-smoke-ffff'" in error and "ls runs/" in error
    before = _evaluation("before", BEFORE)
    before.save(tmp_path)
    assert cli.main(["compare", RUN_A, str(tmp_path / "before.npz")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "is a run" in error and "an evaluation" in error
    assert cli.main(["compare", "nothing-like-this", RUN_B]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no evaluation 'nothing-like-this', and no run or ledger row" in error


def test_two_trainings_on_different_class_sets_are_compared_with_a_warning():
    """Issue 49 point 14: a training on 3 classes against one on 8 printed a top-1 delta with an interval and no
    word that they learned different tasks."""
    def row(identifier, classes, top1):
        return {"id": identifier, "kind": "train", "name": "resnet18", "created_at": "2026-12-06T00:00:00",
                "status": "ok", "duration_seconds": 3.0, "parameters": {"epochs": 1},
                "metrics": {"val_top1": top1, "val_images": 100, "classes": classes}}

    three, eight = [f"class{i}" for i in range(3)], [f"class{i}" for i in range(8)]
    result = run_comparison.compare_rows(row(1, three, 0.9), row(2, eight, 0.6), draws=200)
    assert result.warnings == ["train resnet18: A learned 3 classes and B 8, not the same set: their accuracies "
                               "measure different tasks and are not comparable"]
    assert result.format().splitlines()[2].startswith("warning: train resnet18: A learned 3 classes")
    assert result.to_dict()["warnings"] == result.warnings
    assert run_comparison.compare_rows(row(1, three, 0.9), row(2, three, 0.6), draws=200).warnings == []
    assert run_comparison.compare_rows(row(1, None, 0.9), row(2, eight, 0.6), draws=200).warnings == []  # older rows
