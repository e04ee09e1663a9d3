import base64
import dataclasses
import json
import time

import nbformat
import pytest
from conftest import CHROMIUM_ARGS, ROOT

from course_lib import cli, ledger, report

# A 1x1 PNG: what a notebook's figure output holds, base64-encoded.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
CLAIMS_TABLE = ("<table><thead><tr><th></th><th>article</th><th>measured here</th><th>met</th></tr>"
                "<tr><th>claim</th><th></th><th></th><th></th></tr></thead><tbody>"
                "<tr><th>AMP is faster</th><td>1.5-3x</td><td>1.1x</td><td>no</td></tr>"
                "<tr><th>AMP keeps accuracy</th><td>same</td><td>same</td><td>yes</td></tr></tbody></table>")


def _executed_notebook(path, with_claims=True, figures=2):
    cells = [nbformat.v4.new_markdown_cell("# 03 title")]
    for number in range(figures):
        cell = nbformat.v4.new_code_cell("plt.show()")
        cell.outputs = [nbformat.v4.new_output("display_data", data={
            "image/png": base64.b64encode(PNG + bytes([number])).decode(), "text/plain": "<Figure>"})]
        cells.append(cell)
    if with_claims:
        cells.append(nbformat.v4.new_markdown_cell("## What we measured vs. what the article claims"))
        claims = nbformat.v4.new_code_cell("claims")
        claims.outputs = [nbformat.v4.new_output("execute_result", data={"text/html": CLAIMS_TABLE,
                                                                          "text/plain": "..."}, execution_count=1)]
        cells.append(claims)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)


def _fake_run(tmp_path, run_id="20260101-000000-smoke-abcd"):
    """A run folder as `workbook run` leaves it, and the ledger rows its kernels wrote."""
    folder = tmp_path / "runs" / run_id
    folder.mkdir(parents=True)
    _executed_notebook(folder / "03_amp.ipynb")
    _executed_notebook(folder / "04_accumulation.ipynb", with_claims=False, figures=0)
    results = [{"notebook": name, "status": status, "duration_seconds": 12.5, "output": name, "html": None,
                "error": error, "parameters": {"profile": "smoke"}}
               for name, status, error in (("03_amp.ipynb", "ok", None),
                                           ("04_accumulation.ipynb", "failed", "cell 3: ValueError: bad"))]
    (folder / "summary.json").write_text(json.dumps({"run_id": run_id, "profile": "smoke", "state": "finished",
                                                     "results": results, "not_run": ["05_ddp.ipynb"]}))
    book = ledger.Ledger()
    book.record("train", "resnet18", metrics={"val_top1": 0.61, "images_per_second": 100.0}, run_id=run_id)
    book.record("train", "resnet18", metrics={"val_top1": 0.64, "images_per_second": 250.0}, run_id=run_id)
    book.record("eval", "03-eval", metrics={"top1": 0.66}, run_id=run_id)
    book.record("train", "broken", status="failed", metrics={"val_top1": 0.99}, run_id=run_id)
    book.record("notebook", "03_amp.ipynb", run_id=run_id)
    book.record("bench", "loader", metrics={"images_per_second": 900.0}, run_id=run_id)
    book.record("notebook", "04_accumulation.ipynb", status="failed", run_id=run_id)
    book.record("train", "other-run", metrics={"val_top1": 0.9}, run_id="another-run")
    return folder, run_id


def test_rows_are_attributed_to_the_notebook_that_wrote_them(tmp_path):
    folder, run_id = _fake_run(tmp_path)
    groups = report.rows_by_notebook(ledger.Ledger().rows(run_id=run_id))
    assert [row["name"] for row in groups["03_amp.ipynb"]] == ["resnet18", "resnet18", "03-eval", "broken"]
    assert [row["name"] for row in groups["04_accumulation.ipynb"]] == ["loader"]
    found = report.headline(groups["03_amp.ipynb"])
    assert found["top1"] == (0.66, "eval 03-eval")  # the failed run's 0.99 is not a result
    assert found["images_per_second"] == (250.0, "train resnet18")
    assert found["speedup"] == (pytest.approx(2.5), 2, "train resnet18", "train resnet18")
    shown = report.headline_html(found)
    assert "images/s spread over 2 training runs: <b>2.50x</b>" in shown and "not one change's speed-up" in shown
    running = report.rows_by_notebook([{"id": 1, "kind": "notebook", "name": "a"}, {"id": 2, "kind": "train",
                                                                                    "name": "x"}])
    assert [row["name"] for row in running[report.RUNNING]] == ["x"]


def test_claims_and_key_figure_come_from_the_executed_notebook(tmp_path):
    _executed_notebook(tmp_path / "n.ipynb")
    notebook = nbformat.read(tmp_path / "n.ipynb", as_version=4)
    found = report.claims(notebook)
    assert (found["claims"], found["met"], found["judged"]) == (2, 1, 2)
    assert report.key_figure(notebook) == PNG + bytes([1])  # the last figure shown
    _executed_notebook(tmp_path / "bare.ipynb", with_claims=False, figures=0)
    bare = nbformat.read(tmp_path / "bare.ipynb", as_version=4)
    assert report.claims(bare) is None and report.key_figure(bare) is None


def test_a_smoke_runs_claims_column_counts_no_verdict(tmp_path):
    """Issue 50: the run index's "5 of 6 met" counted smoke-run verdicts."""
    smoke_table = CLAIMS_TABLE.replace("<th>met</th>", "<th>verdict</th>").replace(
        "<td>no</td>", "<td>smoke run: not evidence</td>").replace(
        "<td>yes</td>", "<td>smoke run: not evidence</td>")
    _executed_notebook(tmp_path / "n.ipynb")
    notebook = nbformat.read(tmp_path / "n.ipynb", as_version=4)
    notebook.cells[-1].outputs[0]["data"]["text/html"] = smoke_table
    found = report.claims(notebook)
    assert found["smoke"] and found["met"] is None and found["claims"] == 2
    nbformat.write(notebook, tmp_path / "n.ipynb")
    row = report.notebook_row(tmp_path, {"notebook": "n.ipynb", "output": "n.ipynb", "status": "ok",
                                         "duration_seconds": 1.0}, [])
    assert "2 claim(s), smoke run: not evidence" in row and " met<" not in row


def test_workbook_report_regenerates_the_index_with_results(tmp_path, monkeypatch, capsys):
    folder, run_id = _fake_run(tmp_path)
    assert cli.main(["report", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == f"index: {folder / 'index.html'}"
    page = (folder / "index.html").read_text()
    amp, accumulation = page.split("<tr><td>")[1], page.split("<tr><td>")[2]
    assert "top-1 <b>0.660</b>" in amp and "<b>250</b> images/s" in amp and "<b>2.50x</b>" in amp
    assert "1 of 2 met" in amp and "AMP keeps accuracy" in amp
    assert 'src="figures/03_amp.png"' in amp
    assert (folder / "figures" / "03_amp.png").read_bytes() == PNG + bytes([1])
    assert "<b>900</b> images/s" in accumulation and "cell 3: ValueError: bad" in accumulation
    assert "0.9" not in accumulation  # another run's row stays out
    assert "05_ddp.ipynb" in page and "not run" in page
    assert f"<code>workbook compare OTHER_RUN_ID {run_id}</code>" in page  # the only run: compare with another
    _fake_run(tmp_path, run_id="20260102-000000-smoke-later")
    later = (tmp_path / "runs" / "20260102-000000-smoke-later")
    page = report.regenerate(str(later)).read_text()
    assert f"the run before: <code>workbook compare {run_id} 20260102-000000-smoke-later</code>" in page
    monkeypatch.chdir(tmp_path)  # runs/<id> is found by id, under the project folder
    monkeypatch.setattr(report.paths, "project_root", lambda: tmp_path)
    assert cli.main(["report", run_id]) == 0
    assert cli.main(["report", "no-such-run"]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err


def test_a_monitored_training_run_shows_its_utilisation_and_gradient_norms_as_small_plots(tmp_path, monkeypatch):
    from conftest import tiny_config
    from test_train import tensor_bundle

    from course_lib.engine import train

    run_id = "20260101-000000-smoke-mon1"
    folder = tmp_path / "runs" / run_id
    folder.mkdir(parents=True)
    _executed_notebook(folder / "14_profiling.ipynb", with_claims=False, figures=0)
    results = [{"notebook": "14_profiling.ipynb", "status": "ok", "duration_seconds": 3.0,
                "output": "14_profiling.ipynb", "html": None, "error": None, "parameters": {}}]
    monkeypatch.setenv(ledger.RUN_ID_ENV, run_id)  # the run's kernels tag their ledger rows this way
    bundle = tensor_bundle()

    class Slow:  # 2 ms per image: the 3 steps last at least 0.1 s, so the monitor samples several times even
        targets = bundle.train.targets  # on a fast machine (a sparkline needs two points)

        def __len__(self):
            return len(bundle.train)

        def __getitem__(self, index):
            time.sleep(0.002)
            return bundle.train[index]

    train.fit(tiny_config(tmp_path, monitor_interval=0.02, grad_norm_log=True, max_steps=3),
              bundle=dataclasses.replace(bundle, train=Slow()), progress=False, verbose=False)
    ledger.Ledger().record("notebook", "14_profiling.ipynb", run_id=run_id)
    page = report.write_index(folder, run_id, "smoke", results).read_text()
    assert page.count("<polyline") == 2
    assert "gradient norm per step" in page and "process CPU %" in page
    assert report.monitoring_html([{"kind": "train", "metrics": {"val_top1": 0.5}}]) == ""


def test_a_static_page_shows_a_widgets_picture_and_fetches_no_widget_script(tmp_path):
    """Issue 50 point 6: the explorer was blank in the run's HTML and the docs site, whose pages loaded the
    widget script from a CDN. The page shows the picture its output carries instead, and names a widget
    that has none; the docs site's staged chapter is stripped the same way."""
    from course_lib import book, runner

    picture = base64.b64encode(PNG).decode("ascii")
    explorer = nbformat.v4.new_output("display_data", data={
        report.WIDGET_VIEW: {"model_id": "abc", "version_major": 2, "version_minor": 0},
        "image/png": picture, "text/plain": "VBox(children=(...))"})
    slider = nbformat.v4.new_output("display_data", data={
        report.WIDGET_VIEW: {"model_id": "def", "version_major": 2, "version_minor": 0}, "text/plain": "IntSlider()"})
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 09 · Explorer"),
                                               nbformat.v4.new_code_cell("view.widget()", outputs=[explorer, slider])])
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2}}
    run = tmp_path / "run"
    run.mkdir()
    nbformat.write(notebook, str(run / "09_explorer.ipynb"))
    page = runner.to_html(run / "09_explorer.ipynb").read_text()
    assert f"data:image/png;base64,{picture}" in page and report.WIDGET_ONLY in page
    assert "widget-view+json" not in page and "embed-amd" not in page and "cdn.jsdelivr.net/npm/@jupyter-widgets" not in page
    (run / "summary.json").write_text(json.dumps({"run_id": "r", "profile": "smoke"}))
    book.stage(run, ROOT)
    staged = (run / book.SITE_SOURCE / book.CHAPTERS / "09_explorer.ipynb").read_text()
    assert "widget-view+json" not in staged and "widget-state+json" not in staged and picture in staged


HOSTILE = '<img src=x onerror="alert(1)">'


def test_a_tampered_summary_puts_no_markup_and_no_foreign_link_on_the_page(tmp_path):
    """Issue 49 point 3: a notebook name, run id or profile from summary.json ran script when the page loaded,
    and its `html` field could become a javascript: link. Every field is text, and links stay in the run."""
    results = [{"notebook": f"03_{HOSTILE}.ipynb", "status": f"ok{HOSTILE}", "duration_seconds": "abc",
                "output": "javascript:alert(1)", "html": "../../elsewhere.html", "parameters": "not a dict",
                "error": HOSTILE}]
    page = report.write_index(tmp_path, f"run{HOSTILE}", f"cpu{HOSTILE}", results, ledger_rows=[]).read_text()
    assert HOSTILE not in page and "onerror=\"alert" not in page
    assert "javascript:" not in page and "../../elsewhere.html" not in page
    assert "no notebook file" in page and "<td>-</td>" in page  # a duration that is no number shows "-"
    assert report.run_link("03_x.html") == "03_x.html"
    assert [report.run_link(value) for value in ("javascript:alert(1)", "../x.html", "/etc/passwd", "a/b.html", 3)] \
        == [None] * 5


def test_the_docs_site_names_a_tampered_run_as_plain_text(tmp_path):
    from course_lib import book

    run = tmp_path / "run"
    run.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 00 · Setup")]),
                   str(run / "00_setup_check.ipynb"))
    (run / "summary.json").write_text(json.dumps({"run_id": f"r{HOSTILE}", "profile": f"smoke{HOSTILE}"}))
    config = json.loads(book.stage(run, ROOT).read_text())
    assert "<" not in config["site_description"] and '"' not in config["site_description"]
    (run / "summary.json").write_text("[1, 2]")  # not an object: the site still stages
    assert json.loads(book.stage(run, ROOT).read_text())["site_description"] == "run run, profile ?"  # the folder


@pytest.mark.browser
def test_a_tampered_run_page_runs_no_script_in_a_browser(chromium, tmp_path):
    """The same tampered summary, loaded in Chromium: no dialog opens and no planted handler runs."""
    from playwright.sync_api import sync_playwright

    planted = '<img src=x onerror="window.workbookXss=1;alert(1)">'
    results = [{"notebook": f"03_{planted}.ipynb", "status": "ok", "duration_seconds": 1.0, "output": "x.ipynb",
                "html": "javascript:window.workbookXss=2", "parameters": {}, "error": planted}]
    index = report.write_index(tmp_path, f"run{planted}", f"cpu{planted}", results, ledger_rows=[])
    dialogs = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(index.as_uri())
            page.wait_for_load_state("load")
            for link in page.locator("a").all():
                assert not (link.get_attribute("href") or "").startswith("javascript:")
            assert page.evaluate("window.workbookXss") is None and dialogs == []
            assert planted in page.locator("body").inner_text()  # shown as text
        finally:
            browser.close()


def test_a_report_with_a_foreign_monitor_series_or_on_a_full_disk_is_no_traceback(tmp_path, monkeypatch, capsys):
    """Issue 49 point 13: a ledger `monitor_series` of strings, or a full disk, gave `workbook report` a traceback."""
    import errno

    from course_lib import paths

    foreign = {"kind": "train", "metrics": {"monitor_series": ["high", "low", "nan"],
                                            "grad_norm_series": [1.0, "x", 3.0, True]}}
    shown = report.monitoring_html([foreign])
    assert "gradient norm per step: 1 to 3" in shown and "utilisation:" not in shown  # the strings left out
    folder, _ = _fake_run(tmp_path)
    assert cli.main(["report", str(folder)]) == 0
    before = (folder / "index.html").read_text()
    real_write = paths.write_atomically

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(paths, "write_atomically", full)
    capsys.readouterr()
    assert cli.main(["report", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "(No space left on device); free some space" in err[0]
    assert (folder / "index.html").read_text() == before
    monkeypatch.setattr(paths, "write_atomically", real_write)
