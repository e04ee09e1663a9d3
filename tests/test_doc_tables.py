"""The README's and docs/*.md's generated tables match the committed results files, a stale one is found and
rewritten, and the front page stays a front page whose links all lead somewhere."""
import json
import re
import shutil

import pytest
from conftest import ROOT

from course_lib import cli, doc_tables

README_MAX_LINES = 250  # "fits on a few screens"


def test_every_committed_generated_table_is_up_to_date():
    stale = doc_tables.update(ROOT, check=True)
    assert not stale, f"stale generated tables {stale}: run `workbook docs tables` and commit the pages"


def test_the_pages_carry_the_tables_the_tests_used_to_hold_by_hand():
    names = {name for blocks in doc_tables.block_names(ROOT).values() for name in blocks}
    assert {"configuration", "headline", "reference-counts", "reference-accuracy"} <= names
    assert doc_tables.block_names(ROOT)["README.md"] == ["headline"]


@pytest.fixture
def project(tmp_path):
    """A copy of the files the generators read, and one page with two blocks."""
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    shutil.copytree(ROOT / "results" / "reference", tmp_path / "results" / "reference")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("Intro\n\n<!-- generated: headline (workbook docs tables) -->\nSTALE-LINE\n<!-- end generated -->\n\n"
                    "Between\n<!-- generated: benchmark:engine (workbook docs tables) -->\n<!-- end generated -->\nEnd\n")
    return tmp_path


def test_a_stale_table_is_named_then_rewritten_and_the_prose_around_it_is_kept(project):
    page = project / "docs" / "page.md"
    assert doc_tables.update(project, check=True) == ["docs/page.md: headline", "docs/page.md: benchmark:engine"]
    assert "STALE-LINE" in page.read_text()  # --check changes nothing
    assert doc_tables.update(project) == ["docs/page.md: headline", "docs/page.md: benchmark:engine"]
    text = page.read_text()
    assert text.startswith("Intro\n\n") and "\n\nBetween\n" in text and text.endswith("<!-- end generated -->\nEnd\n")
    assert "STALE-LINE" not in text and "| result | measured | hardware | scored on |" in text
    assert doc_tables.update(project, check=True) == []


def test_a_benchmark_block_may_name_another_machines_folder(project):
    folder = project / "benchmarks" / "results" / "machine-b"
    folder.mkdir()
    (folder / "speedrun_speedrun.md").write_text("# Title\n\nHardware: **machine B**\n")
    page = project / "docs" / "page.md"
    page.write_text("<!-- generated: benchmark:machine-b/speedrun_speedrun (workbook docs tables) -->\n"
                    "<!-- end generated -->\n")
    assert doc_tables.update(project) == ["docs/page.md: benchmark:machine-b/speedrun_speedrun"]
    assert "Hardware: **machine B**" in page.read_text() and "# Title" not in page.read_text()


def test_a_choice_block_puts_the_variants_side_by_side_with_the_values_that_differ(project):
    folder = project / "benchmarks" / "results" / "choice"
    runs = {"narrow": (64, 0.981, None), "wide": (80, 0.984, (0.980, 0.988))}
    for variant, (size, top1, interval) in runs.items():
        (folder / variant).mkdir(parents=True)
        stat = {"mean": top1, "low": interval and interval[0], "high": interval and interval[1]}
        record = {"config": {"image_size": size, "epochs": 40, "seed": size}, "split": "a carve-out",
                  "hardware": "machine A", "started": "2026-12-04 05:00", "load_average_before": 0.3,
                  "load_average_after": 2.0, "summary": {"runs": 3 if interval else 1, "top1": stat,
                                                         "top1_tta": stat, "tta_views": 8,
                                                         "seconds": {"mean": 500.0, "low": None}}}
        (folder / variant / "speedrun_best.json").write_text(json.dumps(record))
    table = doc_tables.render("choice:choice", project).splitlines()
    assert table[0].startswith("| variant | image_size | scored on |")  # epochs and the seed are not a difference
    assert len(table[1].split("|")) == len(table[0].split("|"))
    assert table[2].startswith("| narrow | 64 | a carve-out | 1 | 98.10% |")
    assert table[3].startswith("| wide | 80 | a carve-out | 3 | 98.40% [98.00, 98.80] |")
    # a run written after a field was added, the others before it: only a real difference is a column
    newer = json.loads((folder / "wide" / "speedrun_best.json").read_text())
    newer["config"].update(resize_ramp=0.75, optimizer="muon")  # resize_ramp at its default: as the older runs did
    (folder / "muon").mkdir()
    (folder / "muon" / "speedrun_best.json").write_text(json.dumps(newer))
    table = doc_tables.render("choice:choice", project).splitlines()
    assert table[0].startswith("| variant | image_size | optimizer | scored on |") and "resize_ramp" not in table[0]
    assert table[2].startswith("| muon | 80 | muon |") and table[3].startswith("| narrow | 64 | sgd |")
    with pytest.raises(doc_tables.DocTablesError, match="holds no <variant>/speedrun_"):
        doc_tables.render("choice:nothing-here", project)


def test_a_changed_results_file_makes_the_table_stale(project):
    doc_tables.update(project)
    path = project / "benchmarks" / "results" / "speedrun_speedrun.json"
    run = json.loads(path.read_text())
    run["summary"]["top1"]["mean"] = 0.5
    path.write_text(json.dumps(run))
    assert doc_tables.update(project, check=True) == ["docs/page.md: headline"]
    doc_tables.update(project)
    assert "50.00% [96.88, 97.34]" in (project / "docs" / "page.md").read_text()


def test_the_headline_table_reads_the_speed_run_summary():
    run = json.loads((ROOT / "benchmarks" / "results" / "speedrun_speedrun.json").read_text())
    table = doc_tables.headline_table(ROOT)
    top1 = run["summary"]["top1"]
    assert f"{100 * top1['mean']:.2f}% [{100 * top1['low']:.2f}, {100 * top1['high']:.2f}]" in table
    assert run["hardware"] in table and "EuroSAT `valid`" in table


def test_the_headline_table_names_the_best_recipes_record_with_its_epochs_and_seconds(project):
    results = project / "benchmarks" / "results" / "speedrun_best.json"
    run = json.loads(results.read_text())
    run["config"]["epochs"], run["summary"]["top1_tta"] = 99, {"mean": 0.5, "low": 0.25, "high": 0.75}
    results.write_text(json.dumps(run))
    row = next(line for line in doc_tables.headline_table(project).splitlines() if line.startswith("| best recipe"))
    assert f"(99 epochs at {run['config']['image_size']} px)" in row and "50.00% [25.00, 75.00]" in row
    seconds = run["summary"]["seconds"]
    assert f"{seconds['mean']:.0f} [{seconds['low']:.0f}, {seconds['high']:.0f}] s" in row
    assert f"({run['summary']['runs']} seeds" in row


def test_the_headline_gives_the_side_by_side_races_speedup_from_the_newest_race_file(project):
    results = project / "benchmarks" / "results"
    committed = next(results.rglob("race_speedrun_vs_speedrun2.json"))
    run = json.loads(committed.read_text())

    def row():
        return next(line for line in doc_tables.headline_table(project).splitlines() if line.startswith("| speedrun2"))

    ratio = run["speedup"]
    assert f"{ratio['ratio']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}] ({ratio['pairs']} seeds)" in row()
    assert f"{run['top1_change']['delta']:+.2f} points" in row() and run["hardware"] in row()
    newer = {**run, "started": "2099-01-01 00:00", "hardware": "Machine B", "speedup": {**ratio, "ratio": 2.5}}
    (results / "machine-b").mkdir(exist_ok=True)
    (results / "machine-b" / committed.name).write_text(json.dumps(newer))
    assert "2.50x" in row() and "Machine B" in row()  # the newest race, whichever machine ran it
    (results / "machine-b" / committed.name).write_text(json.dumps({**newer, "split": "a fixed carve-out of train"}))
    with pytest.raises(doc_tables.DocTablesError, match="was scored on 'a fixed carve-out"):
        row()
    for path in results.rglob(committed.name):
        path.unlink()
    with pytest.raises(doc_tables.DocTablesError, match="bench_race.py --recipes speedrun,speedrun2"):
        row()


def test_the_headline_says_where_the_imagenette_recipe_stands_once_it_ran_on_imagenette(project):
    def row():
        return next(line for line in doc_tables.headline_table(project).splitlines() if line.startswith("| imagenette"))

    assert "not measured yet" in row() and "workbook data get imagenette" in row()
    interval = {"mean": 0.88, "low": 0.87, "high": 0.89, "runs": 5}
    run = {"on_imagenette": True, "hardware": "NVIDIA H100", "load_average_before": 0.1, "load_average_after": 1.0,
           "started": "2026-12-07 10:00", "config": {"image_size": 160, "epochs": 5},
           "summary": {"runs": 5, "test_top1": interval, "test_top5": {**interval, "mean": 0.99, "high": 1.0}},
           "gap": {"points": 0.57, "low": -0.43, "high": 1.57, "runs": 5}}
    (project / "benchmarks" / "results" / "imagenette.json").write_text(json.dumps(run))
    assert "top-1 88.00% [87.00, 89.00]; top-5 99.00% [87.00, 100.00]; +0.57 points [-0.43, +1.57]" in row()
    assert "NVIDIA H100, load 0.1-1.0, 2026-12-07 10:00" in row() and "(5 runs, mean [95% interval]; 160 px" in row()


def test_the_headline_refuses_a_race_that_was_not_scored_on_the_held_out_split(project):
    results = project / "benchmarks" / "results" / "speedrun_best.json"
    run = json.loads(results.read_text())
    run["split"] = "a fixed carve-out of train (choosing)"
    results.write_text(json.dumps(run))
    with pytest.raises(doc_tables.DocTablesError, match="speedrun_best.json was scored on 'a fixed carve-out") as caught:
        doc_tables.headline_table(project)
    assert "\n" not in str(caught.value) and "--validation-from train" in str(caught.value)


@pytest.mark.parametrize("page, message", [
    ("<!-- generated: nonsense (workbook docs tables) -->\n<!-- end generated -->\n", "no generated table is called"),
    ("<!-- generated: headline (workbook docs tables) -->\nno end\n", "has no '<!-- end generated -->' line"),
    ("<!-- generated: benchmark:missing (workbook docs tables) -->\n<!-- end generated -->\n", "missing.md is missing"),
])
def test_a_bad_block_is_one_line_naming_the_fix(project, page, message):
    (project / "docs" / "page.md").write_text(page)
    with pytest.raises(doc_tables.DocTablesError, match=re.escape(message)) as caught:
        doc_tables.update(project)
    assert "\n" not in str(caught.value)


def test_the_cli_checks_the_committed_pages(capsys):
    assert cli.main(["docs", "tables", "--check"]) == 0
    assert "all up to date" in capsys.readouterr().out


def test_the_race_figure_is_drawn_from_the_committed_benchmark(tmp_path):
    out = tmp_path / "race.png"
    figure = doc_tables.race_figure(out)
    run = json.loads((ROOT / "benchmarks" / "results" / "speedrun_speedrun.json").read_text())
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(figure.axes[0].get_lines()) == len(run["seeds"]) + 2  # one curve per seed, the target, the 150 s line


def test_the_readme_is_a_front_page_whose_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for section in ("## Quick start", "## Chapters", "## Headline results", "## Where to go next"):
        assert section in readme
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which is missing"


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert not unlinked, f"docs pages the README does not link to: {unlinked}"
