"""The executed book (`make docs`): a run's chapters, the docs pages and the scoreboard staged for MkDocs and
built into a static site, which headless Chromium then reads: the navigation leads to a chapter, and the
chapter shows its rendered figure and table."""
import json
from pathlib import Path

import nbformat
import pytest
from conftest import CHROMIUM_ARGS, ROOT

from course_lib import book, cli, runner


def _fake_run(folder, notebooks=("00_setup_check.ipynb",)):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"run_id": folder.name, "profile": "smoke"}))
    for name in notebooks:
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Chapter title\n\ntext"),
                                                   nbformat.v4.new_code_cell("1 + 1")])
        nbformat.write(notebook, folder / name)
    return folder


def test_a_run_is_staged_with_the_front_page_the_pages_the_chapters_and_the_scoreboard(tmp_path):
    run = _fake_run(tmp_path / "runs" / "20260101-000000-smoke-abcd", ("00_setup_check.ipynb", "09_x.ipynb"))
    config = json.loads(book.stage(run, ROOT).read_text())
    source = run / book.SITE_SOURCE
    front = (source / "index.md").read_text()
    assert "](docs/" not in front and "](profiles.md)" in front and "](images/race.png)" in front
    assert (source / "images" / "race.png").is_file() and (source / "profiles.md").is_file()
    assert sorted(p.name for p in (source / book.CHAPTERS).iterdir()) == ["00_setup_check.ipynb", "09_x.ipynb"]
    assert "Claims scoreboard" in (source / "scoreboard.md").read_text()
    nav = {next(iter(item)): next(iter(item.values())) for item in config["nav"]}
    assert nav["Chapters"] == [{"Chapter title": "chapters/00_setup_check.ipynb"}, {"Chapter title": "chapters/09_x.ipynb"}]
    assert config["extra_css"] == [book.STYLESHEET] and "overflow-x: auto" in (source / book.STYLESHEET).read_text()
    assert {"Profiles and parameters": "profiles.md"} in nav["Reference"]
    assert config["docs_dir"] == book.SITE_SOURCE and config["site_dir"] == book.SITE


def test_a_chapter_title_in_the_navigation_is_its_heading_as_text(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 03 · Mixed precision and `torch.compile`")])
    nbformat.write(notebook, tmp_path / "03_x.ipynb")
    assert book._chapter_title(tmp_path / "03_x.ipynb") == "03 · Mixed precision and torch.compile"


def test_a_run_without_chapters_is_one_line_naming_the_fix(tmp_path):
    run = _fake_run(tmp_path / "empty", ())
    with pytest.raises(book.BookError, match="holds no executed chapter.*workbook run --profile smoke") as caught:
        book.stage(run, ROOT)
    assert "\n" not in str(caught.value)


def test_the_cli_refuses_a_run_that_is_not_one(tmp_path, capsys):
    assert cli.main(["docs", "build", str(tmp_path)]) == 2
    assert "is not a run (no summary.json" in capsys.readouterr().err


@pytest.mark.parametrize("written", [book.SITE_SOURCE, book.SITE, "mkdocs.yml"])
def test_a_link_where_the_site_or_its_config_is_written_is_refused_and_its_target_kept(tmp_path, written):
    """Issue 49 point 4: through a linked site/ MkDocs' clean step emptied the folder it pointed to, and a linked
    mkdocs.yml had its file overwritten, with exit 0."""
    run = _fake_run(tmp_path / "runs" / "20260101-000000-smoke-abcd")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    target = precious / "keep.txt" if written == "mkdocs.yml" else precious
    (run / written).symlink_to(target)
    with pytest.raises(book.BookError, match=rf"{written} is a symbolic link .*remove the link \(rm .*{written}\)") as caught:
        book.build(run, ROOT)
    assert "\n" not in str(caught.value)
    assert (precious / "keep.txt").read_text() == "mine" and (run / written).is_symlink()


def test_the_site_is_built_aside_and_renamed_into_place_so_a_failed_build_keeps_the_last(tmp_path, monkeypatch):
    import subprocess

    run = _fake_run(tmp_path / "runs" / "20260101-000000-smoke-abcd")
    (run / book.SITE).mkdir()
    (run / book.SITE / "index.html").write_text("the last site")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "Error: broken page"))
    with pytest.raises(book.BookError, match="mkdocs build failed .*broken page"):
        book.build(run, ROOT)
    assert (run / book.SITE / "index.html").read_text() == "the last site"
    monkeypatch.undo()

    def built(command, **options):  # what MkDocs does: writes the site into --site-dir
        folder = command[command.index("--site-dir") + 1]
        (tmp_path / "seen").write_text(folder)
        (Path(folder) / "index.html").write_text("the new site")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", built)
    assert book.build(run, ROOT).read_text() == "the new site"
    assert ".partial-" in (tmp_path / "seen").read_text()  # never the site itself: MkDocs cleans what it writes to
    assert not list(run.glob(f"{book.SITE}.partial-*"))


def test_the_newest_run_is_the_default(tmp_path):
    for name in ("20260101-000000-smoke-aaaa", "20260102-000000-cpu-bbbb"):
        _fake_run(tmp_path / name)
    (tmp_path / "checkpoints").mkdir()
    assert [p.name for p in book.run_folders(tmp_path)] == ["20260101-000000-smoke-aaaa", "20260102-000000-cpu-bbbb"]


def test_the_default_run_is_the_newest_by_time_and_never_one_still_marked_running(tmp_path, monkeypatch, capsys):
    """A run named with --out (`runs/baseline`) once won forever, being last by name, and a killed run still
    marked "running" was published (issue 49)."""
    import os

    for age, name in ((300, "20260101-000000-smoke-aaaa"), (200, "zz-baseline"), (100, "20260102-000000-cpu-bbbb"),
                      (0, "20260103-000000-cpu-killed")):
        run = _fake_run(tmp_path / name)
        if name.endswith("killed"):
            (run / "summary.json").write_text(json.dumps({"run_id": name, "profile": "cpu", "state": "running"}))
        stamp = 1_800_000_000 - age
        os.utime(run / "summary.json", (stamp, stamp))
    assert [p.name for p in book.run_folders(tmp_path)] == ["20260101-000000-smoke-aaaa", "zz-baseline",
                                                           "20260102-000000-cpu-bbbb", "20260103-000000-cpu-killed"]
    run, passed = book.newest_finished_run(tmp_path)
    assert run.name == "20260102-000000-cpu-bbbb" and [p.name for p in passed] == ["20260103-000000-cpu-killed"]
    built = []
    monkeypatch.setattr(book, "build", lambda run, root: built.append(run.name) or run / "site" / "index.html")
    monkeypatch.setattr("course_lib.paths.RUNS_DIR", str(tmp_path.relative_to(tmp_path.parent)))
    monkeypatch.chdir(tmp_path.parent)
    root = tmp_path.parent
    monkeypatch.setattr("course_lib.paths.project_root", lambda: root)
    assert cli.main(["docs", "build"]) == 0
    assert built == ["20260102-000000-cpu-bbbb"] and "passed over 20260103-000000-cpu-killed" in capsys.readouterr().out
    for name in ("20260101-000000-smoke-aaaa", "zz-baseline", "20260102-000000-cpu-bbbb"):
        (tmp_path / name / "summary.json").write_text(json.dumps({"run_id": name, "state": "running"}))
    assert cli.main(["docs", "build"]) == 2
    assert "no finished run under runs/" in capsys.readouterr().err


# In the page: the code blocks, tables and outputs wider than their box that nothing lets the reader
# scroll to (neither they nor a box around them scroll sideways), and how many were wider than their box.
CUT_OFF = """root => {
  const cut = []; let wide = 0;
  for (const element of root.querySelectorAll("pre, table, .jp-OutputArea-output")) {
    if (element.scrollWidth <= element.clientWidth + 1) continue;
    wide += 1;
    let node = element, scrolls = false;
    while (node && node !== root.parentElement) {
      const overflow = getComputedStyle(node).overflowX;
      if ((overflow === "auto" || overflow === "scroll") && node.scrollWidth > node.clientWidth) { scrolls = true; break; }
      node = node.parentElement;
    }
    if (!scrolls) cut.push(element.tagName + ": " + element.textContent.trim().slice(0, 40));
  }
  return {cut, wide};
}"""


@pytest.mark.notebook
@pytest.mark.browser
def test_the_site_of_a_smoke_run_shows_a_chapter_with_its_figure_and_table(chromium, tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    # One chapter executed as `workbook run` executes it (runner.run_workbook would also export its run's
    # environment into this test process, which later tests would inherit).
    run = tmp_path / "run"
    run.mkdir()
    result = runner.execute_notebook(ROOT / "notebooks" / "00_setup_check.ipynb", run / "00_setup_check.ipynb",
                                     {"profile": "smoke"})
    assert result.status == "ok", result.error
    # a line of code and a table far wider than any window: the site must let the reader scroll to their ends
    executed = nbformat.read(run / "00_setup_check.ipynb", as_version=4)
    executed.cells.append(nbformat.v4.new_code_cell("wide = " + " + ".join(f"value_{i}" for i in range(60))))
    executed.cells.append(nbformat.v4.new_markdown_cell("| " + " | ".join(f"column number {i}" for i in range(40))
                                                        + " |\n|" + "---|" * 40 + "\n| " + " | ".join("x" * 40)
                                                        + " |\n"))
    nbformat.write(executed, run / "00_setup_check.ipynb")
    (run / "summary.json").write_text(json.dumps({"run_id": "test-run", "profile": "smoke"}))
    index = book.build(run, ROOT)
    assert index.is_file()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(index.as_uri())
            assert "Fast CNN Training Workbook" in page.title()
            page.locator("nav a", has_text="Setup check").first.click()  # notebook 00: "00 · Setup check"
            page.wait_for_load_state()
            assert page.url.endswith("chapters/00_setup_check.html")
            content = page.locator("article, .md-content").first
            figures = content.locator("img[src^='data:image/png'], img[src$='.png']")
            assert figures.count() >= 1 and figures.first.evaluate("img => img.naturalWidth") > 0
            assert content.locator("table").count() >= 1
            page.set_viewport_size({"width": 1400, "height": 900})
            shown = content.evaluate(CUT_OFF)
            assert shown["wide"] >= 2 and shown["cut"] == [], shown  # the planted code line and table scroll
            # On a wide screen the column widens past the theme's 61rem (about 1,400 px there), so wide code
            # and tables are shown whole instead of in a narrow scrolling box.
            page.set_viewport_size({"width": 2400, "height": 900})
            column = page.evaluate("document.querySelector('.md-main__inner').getBoundingClientRect().width")
            assert column > 1600, column
            page.locator("nav a", has_text="Claims scoreboard").first.click()
            page.wait_for_load_state()
            assert "Claims scoreboard" in page.locator("h1").first.inner_text()
            assert page.locator("article, .md-content").first.evaluate(CUT_OFF)["cut"] == []
        finally:
            browser.close()


def test_a_corrupt_executed_notebook_is_left_out_in_one_line_and_the_rest_is_built(tmp_path, capsys):
    """Issue 49 point 13: one cut-short executed notebook made `docs build` a traceback."""
    run = _fake_run(tmp_path / "runs" / "20260101-000000-smoke-abcd", ("00_setup_check.ipynb",))
    (run / "09_cut.ipynb").write_text('{"cells": [')
    config = json.loads(book.stage(run, ROOT).read_text())
    assert sorted(p.name for p in (run / book.SITE_SOURCE / book.CHAPTERS).iterdir()) == ["00_setup_check.ipynb"]
    assert len(next(item for item in config["nav"] if "Chapters" in item)["Chapters"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "09_cut.ipynb left out of the site: it cannot be read as a notebook" in err[0]
    (run / "00_setup_check.ipynb").write_text("not json")
    with pytest.raises(book.BookError, match="holds no executed chapter"):
        book.stage(run, ROOT)


def test_a_run_on_a_read_only_mount_is_one_line_before_anything_is_written(small_disk, capsys):
    """Issue 49 point 13: `docs build` of a run in a read-only checkout ended in a traceback."""
    import subprocess

    run = _fake_run(small_disk / "20260101-000000-smoke-abcd")
    done = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only here: {done.stderr.strip()}")
    try:
        assert cli.main(["docs", "build", str(run)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"cannot write to {run}" in err[0] and "copy the run folder" in err[0], err
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], capture_output=True)
