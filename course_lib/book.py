"""The executed book: the README and docs/*.md, the chapters as one run executed them (runs/<id>/NN_*.ipynb,
outputs and figures included) and the claims scoreboard, built into a static site (`make docs`, `workbook
docs build`), so the chapters can be read with their outputs without running them, as d2l, fastbook and
uvadlc publish theirs.

Why MkDocs with mkdocs-material and mkdocs-jupyter rather than Jupyter Book 2: the pages are already plain
Markdown and the run already holds executed .ipynb files, which mkdocs-jupyter renders as they are (nbconvert,
no re-execution), all from pip in Python; Jupyter Book 2 builds with mystmd, a Node.js program the venv does
not have. The site is static HTML with its search index, readable from the folder or any web server."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from course_lib import paths
from course_lib.config import WorkbookError

SITE_SOURCE = "site-src"  # inside the run folder: what MkDocs reads (generated, never edited)
SITE = "site"  # inside the run folder: the built site, site/index.html its front page
CHAPTERS = "chapters"  # the executed notebooks, inside SITE_SOURCE
BUILD_SECONDS = 600
NOTEBOOK = re.compile(r"^(\d\d)_[\w-]+\.ipynb$")
# README links that point into docs/ become links inside the site, whose pages sit side by side.
DOCS_LINK = re.compile(r"\]\(docs/")
STYLESHEET = "workbook.css"  # inside SITE_SOURCE
# The theme's column is 61rem, and a notebook's code, its outputs and the scoreboard are wider: they get a
# wider column and scroll sideways inside it, never cut off (tests/test_book.py checks every one).
SITE_CSS = """.md-grid { max-width: 90rem; }
.md-typeset pre, .md-typeset .highlight, .md-typeset .jp-Cell, .md-typeset .jp-OutputArea-output,
.md-typeset .jp-RenderedHTMLCommon { max-width: 100%; overflow-x: auto; }
.md-typeset table:not([class]), .md-typeset .jp-RenderedHTMLCommon table {
  display: block; max-width: 100%; overflow-x: auto; }
"""


class BookError(WorkbookError):
    """No run to publish, or MkDocs missing or failing; one line with the fix."""


def run_folders(runs: Path | None = None) -> list[Path]:
    """Run folders under runs/ (those with a summary.json), oldest first by when their summary.json was last
    written (a folder given with `workbook run --out` has no date in its name), then by name."""
    runs = Path(runs or paths.project_root() / paths.RUNS_DIR)
    found = [p for p in runs.glob("*/") if (p / "summary.json").is_file()] if runs.is_dir() else []
    return sorted(found, key=lambda p: ((p / "summary.json").stat().st_mtime, p.name))


def run_state(run: Path) -> str:
    """The run's state as its summary.json says ("running" for one killed before it could say more); "unreadable"
    for a summary.json that is not a JSON object."""
    try:
        summary = json.loads((Path(run) / "summary.json").read_text())
    except (OSError, ValueError):
        return "unreadable"
    return str(summary.get("state", "finished")) if isinstance(summary, dict) else "unreadable"


def newest_finished_run(runs: Path | None = None) -> tuple[Path | None, list[Path]]:
    """The newest run that is no longer running (`run_folders`' order), and the newer ones passed over (still
    running, killed mid-run, or unreadable), for `workbook docs build` without a run id."""
    passed = []
    for run in reversed(run_folders(runs)):
        if run_state(run) not in ("running", "unreadable"):
            return run, passed
        passed.append(run)
    return None, passed


def executed_chapters(run: Path) -> list[Path]:
    """The run's executed chapter notebooks, in chapter order."""
    return sorted(p for p in Path(run).glob("*.ipynb") if NOTEBOOK.match(p.name))


def _chapter_title(notebook: Path) -> str:
    """The first Markdown heading of the notebook without its code marks (the navigation shows text:
    "03 · Mixed precision and torch.compile"), else its file name."""
    cells = json.loads(notebook.read_text()).get("cells", [])
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            text = "".join(cell.get("source", []))
            heading = next((line.lstrip("# ").replace("`", "").strip() for line in text.splitlines()
                            if line.startswith("#")), "")
            if heading:
                return heading
    return notebook.stem


def _front_page(root: Path) -> str:
    """README.md with its docs/ links and pictures pointing inside the site."""
    return DOCS_LINK.sub("](", (root / "README.md").read_text())


def _scoreboard_page(ledger_path: Path | None) -> str:
    from course_lib import ledger, report

    book = ledger.Ledger(ledger_path) if ledger_path else None
    return ("# Claims scoreboard\n\nEvery claim of the two articles with the newest measurement per machine in "
            "this project's ledger (`workbook claims`), smoke-profile measurements apart.\n\n"
            + report.scoreboard_html(book) + "\n")


def stage(run: Path, root: Path | None = None, ledger_path: Path | None = None) -> Path:
    """Write RUN/site-src/: the front page, the docs pages and images, the executed chapters, the scoreboard
    and mkdocs.yml with the navigation. Returns the mkdocs.yml path."""
    import nbformat

    from course_lib import report, run_summary

    root, run = Path(root or paths.project_root()), Path(run)
    chapters, notebooks = [], {}
    for path in executed_chapters(run):  # one unreadable notebook is left out in one line; the rest is built
        try:
            notebooks[path] = report.without_widgets(nbformat.read(str(path), as_version=4))
            chapters.append(path)
        except (OSError, ValueError, nbformat.reader.NotJSONError, nbformat.ValidationError) as error:
            print(f"workbook docs: warning: {path.name} left out of the site: it cannot be read as a notebook "
                  f"({str(error).splitlines()[0][:120] if str(error) else type(error).__name__})", file=sys.stderr)
    if not chapters:
        raise BookError(f"{run} holds no executed chapter (NN_name.ipynb); run `workbook run --profile smoke` "
                        "(or `make workbook`) first, or name another run")
    source = run / SITE_SOURCE
    for written in (source, run / SITE, run / "mkdocs.yml"):
        refuse_link(written)
    # a read-only checkout: one line before anything is deleted or written (issue 49, point 13)
    paths.check_writable(run, "copy the run folder where you can write, and build it there")
    if source.exists():
        shutil.rmtree(source)
    (source / CHAPTERS).mkdir(parents=True)
    (source / "index.md").write_text(_front_page(root))
    pages = sorted((root / "docs").glob("*.md"))
    for page in pages:
        shutil.copy2(page, source / page.name)
    if (root / "docs" / "images").is_dir():
        shutil.copytree(root / "docs" / "images", source / "images")
    for notebook in chapters:  # widgets as their static forms: a static site has no kernel behind them
        nbformat.write(notebooks[notebook], str(source / CHAPTERS / notebook.name))
    (source / "scoreboard.md").write_text(_scoreboard_page(ledger_path))
    (source / STYLESHEET).write_text(SITE_CSS)
    summary = run_summary.read_or_empty(run)  # unusable: the site still builds, its description says "?"
    nav = [{"Home": "index.md"},
           {"Chapters": [{_chapter_title(n): f"{CHAPTERS}/{n.name}"} for n in chapters]},
           {"Claims scoreboard": "scoreboard.md"},
           {"Reference": [{_page_title(p): p.name} for p in pages]}]
    config = {
        "site_name": "Fast CNN Training Workbook",
        # names only: a tampered summary.json must not put markup into every page's head (issue 49, point 3)
        "site_description": f"run {_plain(summary.get('run_id', run.name))}, profile {_plain(summary.get('profile'))}",
        # relative to this file, which lives in the run folder (MkDocs refuses a docs_dir holding its config)
        "docs_dir": SITE_SOURCE, "site_dir": SITE, "use_directory_urls": False,
        "theme": {"name": "material", "features": ["navigation.sections", "search.highlight"]},
        "plugins": ["search", {"mkdocs-jupyter": {"execute": False, "include_source": True}}],
        "markdown_extensions": ["tables", "admonition", "attr_list"],
        "extra_css": [STYLESHEET],
        "nav": nav,
    }
    config_path = run / "mkdocs.yml"
    config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return config_path


def refuse_link(path: Path) -> None:
    """What `docs build` deletes and writes (site-src/, site/, mkdocs.yml) must be the run's own: through a
    symbolic link, MkDocs' clean step would empty the folder it points to, and the config write would overwrite
    the file (issue 49, point 4). One line naming the link and the `rm` that removes it (not its target)."""
    if path.is_symlink():
        raise BookError(f"{path} is a symbolic link (to {os.readlink(path)}); docs build deletes and rewrites it, so it "
                        f"will not write through a link: remove the link (rm {shlex.quote(str(path))}) and build again")


def _plain(value) -> str:
    """A run id or profile as page text: letters, digits, '.', '_' and '-' only (others become '?')."""
    return re.sub(r"[^\w.-]", "?", str(value if value is not None else "?"))[:80]


def _page_title(page: Path) -> str:
    first = next(iter(page.read_text().splitlines()), "")
    return first.lstrip("# ").replace("`", "").strip() or page.stem


def build(run: Path, root: Path | None = None, ledger_path: Path | None = None) -> Path:
    """Stage RUN and build it with MkDocs into RUN/site/; returns RUN/site/index.html."""
    try:
        import mkdocs  # noqa: F401
        import mkdocs_jupyter  # noqa: F401
        import material  # noqa: F401
    except ImportError as error:
        raise BookError(f"{error.name} is not installed; `make venv` installs mkdocs-material and mkdocs-jupyter "
                        "(the project's dev extra)") from None
    config = stage(run, root, ledger_path)
    # Built into a fresh folder of the run, then renamed into place: MkDocs' clean step only ever empties a folder
    # this build made, and a failed build leaves the last site whole.
    from course_lib.data.build_lock import staging_folder

    site = Path(run) / SITE
    building = staging_folder(site)  # site.partial-<pid>; those of killed builds removed
    try:
        done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "--config-file", str(config),
                               "--site-dir", str(building.resolve())],
                              cwd=config.parent, capture_output=True, text=True, timeout=BUILD_SECONDS)
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise BookError(f"mkdocs build failed for {run}: {last[0]}")
        refuse_link(site)  # planted while MkDocs ran
        if site.exists():
            shutil.rmtree(site)
        building.rename(site)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return site / "index.html"
