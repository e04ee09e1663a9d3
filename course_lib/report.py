"""The run report `runs/<id>/index.html`: one row per notebook with its status and duration, its headline numbers read
from the ledger rows the run wrote (best top-1, best images/s, the fastest-over-slowest spread of its training runs'
images/s), its claims table ("what we measured vs. what the article claims") and its key figure (the last image the
executed notebook shows, read with nbformat) as a thumbnail. `workbook run` rewrites it after every notebook;
`workbook report RUN_ID` regenerates it from `summary.json`, the ledger and the executed notebooks.
"""
from __future__ import annotations

import base64
import html
import math
import re
from html.parser import HTMLParser
from pathlib import Path

from course_lib import ledger, machine, paths
from course_lib.config import WorkbookError

STATUS_COLOURS = {"ok": "#1a7f37", "failed": "#cf222e", "interrupted": "#bc4c00", "not run": "#6e7781"}
# Metric names notebooks and the engine record, by what they measure (the first found wins per row).
TOP1_KEYS = ("val_top1", "top1", "val top-1", "test top-1")
SPEED_KEYS = ("images_per_second", "images/s")
CLAIMS_HEADING = "what we measured vs"
FIGURES_DIR = "figures"
# A link the run's page may hold: a file in the run's own folder (no scheme such as javascript:, no folder, no ..).
RUN_FILE = re.compile(r"^\w[\w.-]*$")


def run_link(value) -> str | None:
    """`value` (summary.json's `output` or `html`) when it names a file in the run's folder, else None: a
    tampered summary cannot make the page link elsewhere or run script (issue 49, point 3)."""
    return value if isinstance(value, str) and RUN_FILE.match(value) and ".." not in value else None


def _seconds(value) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"
THUMBNAIL_PIXELS = 220
# Rows grouped by the notebook that wrote them (the ledger knows how the runner records them).
RUNNING, rows_by_notebook = ledger.RUNNING, ledger.rows_by_notebook


def _first(metrics: dict, keys) -> float | None:
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            return float(value)
    return None


def headline(rows: list[dict]) -> dict:
    """Best top-1 and best images/s among `rows` (with the row that holds each), and the spread of
    training speeds when there are several runs: (fastest / slowest images/s, runs, fastest row, slowest row).
    The runs differ in their settings (a grid, model families), so the spread is a range, not the
    speed-up of one change; the chapter's own tables give those."""
    found = {"rows": len(rows), "top1": None, "images_per_second": None, "speedup": None}
    best_top1 = best_speed = None
    train_speeds = []  # (images/s, "kind name")
    for row in rows:
        if row.get("status") not in (None, "ok"):
            continue
        top1, speed = _first(row["metrics"], TOP1_KEYS), _first(row["metrics"], SPEED_KEYS)
        if top1 is not None and (best_top1 is None or top1 > best_top1[0]):
            best_top1 = (top1, f"{row['kind']} {row['name']}")
        if speed is not None and (best_speed is None or speed > best_speed[0]):
            best_speed = (speed, f"{row['kind']} {row['name']}")
        if speed is not None and row["kind"] == "train":
            train_speeds.append((speed, f"{row['kind']} {row['name']}"))
    found["top1"], found["images_per_second"] = best_top1, best_speed
    if len(train_speeds) >= 2 and min(train_speeds)[0] > 0:
        (slowest, slow_name), (fastest, fast_name) = min(train_speeds), max(train_speeds)
        found["speedup"] = (fastest / slowest, len(train_speeds), fast_name, slow_name)
    return found


def headline_html(found: dict) -> str:
    parts = []
    if found["top1"]:
        parts.append(f"top-1 <b>{found['top1'][0]:.3f}</b> <small>({html.escape(found['top1'][1])})</small>")
    if found["images_per_second"]:
        parts.append(f"<b>{found['images_per_second'][0]:,.0f}</b> images/s "
                     f"<small>({html.escape(found['images_per_second'][1])})</small>")
    if found["speedup"]:
        ratio, runs, fastest, slowest = found["speedup"]
        parts.append(f"images/s spread over {runs} training runs: <b>{ratio:.2f}x</b> <small>(fastest "
                     f"{html.escape(fastest)} over slowest {html.escape(slowest)}; runs of different settings, "
                     "not one change's speed-up)</small>")
    if not parts:
        return f"<small>{found['rows']} ledger row(s), no accuracy or speed among them</small>"
    return "<br>".join(parts)


def sparkline_svg(values: list[float], label: str, width: int = 160, height: int = 32) -> str:
    """A small inline SVG line plot of `values` with its label and range (no image file needed); what is not a
    finite number (a tampered or foreign ledger row) is left out."""
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
              and math.isfinite(v)] if isinstance(values, (list, tuple)) else []
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    points = " ".join(f"{i * (width - 2) / (len(values) - 1) + 1:.1f},{height - 1 - (v - low) / span * (height - 2):.1f}"
                      for i, v in enumerate(values))
    return (f'<div><small>{html.escape(label)}: {low:.3g} to {high:.3g}</small><br><svg width="{width}" '
            f'height="{height}" role="img" aria-label="{html.escape(label)}"><polyline fill="none" stroke="#0969da" '
            f'stroke-width="1.5" points="{points}"/></svg></div>')


def monitoring_html(rows: list[dict]) -> str:
    """Small plots of the last training run that monitored (monitor_interval) or logged gradient norms."""
    for row in reversed(rows):
        metrics = row.get("metrics") or {}
        if row.get("kind") != "train" or not (metrics.get("monitor_series") or metrics.get("grad_norm_series")):
            continue
        parts = [sparkline_svg(metrics.get("monitor_series") or [], metrics.get("monitor_series_name", "utilisation")),
                 sparkline_svg(metrics.get("grad_norm_series") or [], "gradient norm per step")]
        findings = metrics.get("grad_norm_findings") or []
        if findings:
            parts.append(f"<small>{html.escape(findings[0])}</small>")
        return "".join(parts)
    return ""


class _TableParser(HTMLParser):
    """Header and body rows of the first HTML table (a pandas DataFrame's rendering: <thead> rows,
    of which the first names the columns, then <tbody> rows)."""

    def __init__(self):
        super().__init__()
        self.header: list[str] = []
        self.body: list[list[str]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._tables = 0
        self._in_head = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._tables += 1
        elif self._tables != 1:
            return
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if self._tables != 1:
            return
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "tr" and self._row is not None:
            if (self._in_head or not self.header) and not self.body:
                self.header = self.header or self._row
            else:
                self.body.append(self._row)
            self._row = None
        elif tag == "table":
            self._tables += 1  # only the first table is read

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def claims(notebook) -> dict | None:
    """The claims table an executed notebook shows after its "What we measured vs. ..." heading:
    {"html": the table, "claims": rows, "met": rows judged met or None, "judged": rows judged, "smoke": a
    smoke run's table}. A column whose header says met/verdict/beyond noise/agrees is read as the judgement
    (yes, true, met, ok count as met); notebooks without one, and smoke runs (whose verdicts are no
    evidence), give met=None."""
    cells = notebook.cells
    start = next((i for i, cell in enumerate(cells) if cell.cell_type == "markdown"
                  and CLAIMS_HEADING in cell.source.lower()), None)
    if start is None:
        return None
    for cell in cells[start + 1:]:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("## "):
            return None
        for output in cell.get("outputs", []):
            table = output.get("data", {}).get("text/html")
            if table and "<table" in table:
                parser = _TableParser()
                parser.feed(table)
                header, body = parser.header, parser.body
                judged_column = next((i for i, name in enumerate(header)
                                      if re.search(r"\bmet\b|verdict|beyond noise|agrees", name.lower())), None)
                met = judged = None
                values = ([row[judged_column].lower() for row in body if len(row) > judged_column]
                          if judged_column is not None else [])
                smoke = any(value.startswith("smoke") for value in values)  # claims.show's smoke-run verdicts
                if values and not smoke:
                    judged = len(values)
                    met = sum(value.startswith(("yes", "true", "met", "ok", "holds")) for value in values)
                return {"html": table, "claims": len(body), "met": met, "judged": judged, "smoke": smoke}
    return None


def key_figure(notebook) -> bytes | None:
    """The last PNG the executed notebook shows: its chapter's closing measurement, as a rule."""
    for cell in reversed(notebook.cells):
        for output in reversed(cell.get("outputs", [])):
            image = output.get("data", {}).get("image/png")
            if image:
                return base64.b64decode(image if isinstance(image, str) else "".join(image))
    return None


def _read_notebook(path: Path):
    import nbformat

    try:
        return nbformat.read(str(path), as_version=4)
    except Exception:  # a notebook that did not get written is reported by its status
        return None


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_ONLY = "(an interactive widget: open the notebook in JupyterLab to use it)"


def without_widgets(notebook):
    """`notebook` (an nbformat node, changed in place and returned) as a static page shows it: each widget
    view gives way to the other forms its output carries (the explorer's matrix as a PNG), a widget with no
    other form to a line saying where to use it, and the saved widget state is dropped, so the page fetches
    no widget script from a CDN and shows no blank box offline (the run's HTML pages, the docs site)."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW not in data:
                continue
            del data[WIDGET_VIEW]
            if not set(data) - {"text/plain"}:  # only the widget's repr ("VBox(children=...)") is left
                data.clear()
                data["text/plain"] = WIDGET_ONLY
    notebook.metadata.pop("widgets", None)
    return notebook


def notebook_row(out_dir: Path, result: dict, rows: list[dict]) -> str:
    """One table row: notebook links, status, seconds, headline numbers, claims, key figure."""
    name = str(result["notebook"])
    output, page = run_link(result.get("output")), run_link(result.get("html"))
    links = f'<a href="{html.escape(output)}">ipynb</a>' if output else "no notebook file"
    links = (f'<a href="{html.escape(page)}">{html.escape(name)}</a> ({links})' if page
             else f"{html.escape(name)} ({links})")
    colour = STATUS_COLOURS.get(str(result.get("status")), STATUS_COLOURS["failed"])
    notebook = _read_notebook(out_dir / output) if output and (out_dir / output).exists() else None
    claim_cell = figure_cell = ""
    if notebook is not None:
        found = claims(notebook)
        if found:
            verdict = (f"{found['claims']} claim(s), smoke run: not evidence" if found.get("smoke")
                       else f"{found['met']} of {found['judged']} met" if found["met"] is not None
                       else f"{found['claims']} claim(s) measured")
            claim_cell = f"<details><summary>{verdict}</summary>{found['html']}</details>"
        image = key_figure(notebook)
        if image:
            figures = out_dir / FIGURES_DIR
            figures.mkdir(exist_ok=True)
            target = figures / f"{Path(name).stem}.png"
            target.write_bytes(image)
            relative = html.escape(f"{FIGURES_DIR}/{target.name}")
            figure_cell = (f'<a href="{relative}"><img src="{relative}" width="{THUMBNAIL_PIXELS}" '
                           f'alt="key figure of {html.escape(name)}"></a>')
    parameters = result.get("parameters")
    params = html.escape(", ".join(f"{k}={v}" for k, v in parameters.items())) if isinstance(parameters, dict) else ""
    return (f"<tr><td>{links}<br><small>{params}</small></td><td style='color:{colour}'>{html.escape(str(result.get('status')))}</td>"
            f"<td>{_seconds(result.get('duration_seconds'))}</td><td>{headline_html(headline(rows))}{monitoring_html(rows)}</td>"
            f"<td>{claim_cell}</td><td>{figure_cell}</td><td>{html.escape(result.get('error') or '')}</td></tr>")


def write_index(out_dir: Path, run_id: str, profile: str, results: list[dict], not_run=(),
                state: str = "finished", ledger_rows: list[dict] | None = None) -> Path:
    """index.html: one row per notebook (dicts with NotebookResult's fields), with the ones not
    run yet (`not_run`) at the end; `state` (running | finished | interrupted) says whether the
    list is complete. `ledger_rows` default: the rows of `run_id` in the ledger."""
    out_dir = Path(out_dir)
    if ledger_rows is None:
        try:
            ledger_rows = ledger.Ledger().rows(run_id=run_id)
        except ledger.LedgerError:
            ledger_rows = []  # the page still lists the notebooks; the numbers need the ledger
    groups = rows_by_notebook(ledger_rows)
    table = [notebook_row(out_dir, result, groups.get(result["notebook"], [])) for result in results]
    for name in not_run:
        table.append(f"<tr><td>{html.escape(name)}</td><td style='color:{STATUS_COLOURS['not run']}'>not run</td>"
                     + "<td></td>" * 5 + "</tr>")
    hardware = next((row["hardware"] for row in ledger_rows if row.get("hardware")), None)
    scoreboard = scoreboard_html()
    versions = next((row["versions"] for row in ledger_rows if row.get("versions")), None) or machine.runtime_versions()
    commit = next((row["git_commit"] for row in ledger_rows if row.get("git_commit")), None) or machine.git_commit()
    note = {"running": "<p><b>Running</b>: this page is rewritten after every notebook.</p>",
            "interrupted": "<p><b>Interrupted</b> (Ctrl-C): the notebooks below the interrupted one did not run."
                           "</p>"}.get(state, "")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Workbook run {html.escape(run_id)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}
details table{{font-size:12px}}</style></head><body>
<h1>Workbook run {html.escape(run_id)}</h1>
<p>Profile <b>{html.escape(profile)}</b> on {html.escape(machine.describe_hardware(hardware))};
torch {html.escape(str(versions.get('torch')))}; commit {html.escape(str(commit))}.
Headline numbers come from the ledger rows each notebook wrote (<code>workbook ledger --run {html.escape(run_id)}</code>);
every images/s figure was measured on the hardware named here.</p>
{compare_html(out_dir, run_id)}
{note}
<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>headline numbers</th><th>claims</th>
<th>key figure</th><th>error</th></tr>
{''.join(table)}
</table>
{scoreboard}
</body></html>
"""
    index = out_dir / "index.html"
    paths.write_atomically(index, page)
    return index


def compare_html(out_dir: Path, run_id: str) -> str:
    """The command that compares this run with the one before it in the same runs/ folder (or with any
    other run): the parameters that differ beside the results that differ (`workbook compare`)."""
    # Run ids begin with their start time (runner.new_run_id), so the names sort in time order.
    earlier = sorted(summary.parent.name for summary in Path(out_dir).parent.glob("*/summary.json")
                     if summary.parent.name < run_id)
    other = html.escape(earlier[-1]) if earlier else "OTHER_RUN_ID"
    return (f"<p>Compare with {'the run before' if earlier else 'another run'}: <code>workbook compare {other} "
            f"{html.escape(run_id)}</code> lists the parameters that differ beside the results that differ, with "
            "intervals where the results have them.</p>")


def scoreboard_html(book=None) -> str:
    """The claims scoreboard section: every article claim with claimed, measured, interval, verdict,
    the notebook that measured it and the profile it ran in, newest measurement per machine
    (`workbook claims`). Smoke-profile measurements follow in a table of their own, marked
    "smoke: not evidence" and left out of the counts."""
    from course_lib.analysis import claims

    try:
        board = claims.scoreboard(book)
    except ledger.LedgerError as error:
        return f"<h2>Claims scoreboard</h2><p>{html.escape(str(error))}</p>"
    colours = {claims.HOLDS: "#1a7f37", claims.REFUTED: "#cf222e", claims.NOT_SHOWN: "#9a6700"}
    header = ("<tr><th>notebook</th><th>claim</th><th>source</th><th>claimed</th><th>measured</th><th>interval</th>"
              "<th>verdict</th><th>how / why</th><th>hardware</th><th>profile</th><th>reference (not yours)</th></tr>")

    def reference_of(item) -> str:
        figure = item.get("reference")
        if not figure:
            return "-"
        interval = f" {figure['interval']}" if figure["interval"] != "-" else ""
        return f"{figure['verdict']}: {figure['measured']}{interval} on {figure['hardware']}, {figure['date']}"

    def rows(items, verdict_of):
        return "".join(
            f"<tr><td>{html.escape(item['notebook'])}</td><td>{html.escape(item['statement'])}</td>"
            f"<td>{html.escape(item['source'])}</td><td>{html.escape(item['claimed'])}</td>"
            f"<td>{html.escape(item['measured'])}</td><td>{html.escape(item['interval'])}</td>"
            f"<td style='color:{colours.get(item['verdict'], '#57606a')}'>{html.escape(verdict_of(item))}</td>"
            f"<td>{html.escape(item['reason'])}</td><td>{html.escape(item['hardware'])}</td>"
            f"<td>{html.escape(item.get('profile', claims.UNKNOWN_PROFILE))}</td>"
            f"<td>{html.escape(reference_of(item))}</td></tr>" for item in items)

    evidence = [item for item in board if item.get("evidence", True)]
    smoke = [item for item in board if not item.get("evidence", True)]
    counts = claims.format_counts(board)
    smoke_rows = rows(smoke, lambda item: claims.SMOKE)  # no verdict, not even as measured
    smoke_section = "" if not smoke else (
        f"<details><summary>{html.escape(claims.SMOKE)}: {len(smoke)} measurement(s) of the smoke profile (a "
        f"few steps on tiny inputs, to check that the notebooks run), left out of the counts</summary><table>"
        f"{header}{smoke_rows}</table></details>")
    accuracy = "; ".join(f"{notebook}: {count[claims.CONCLUSIVE]} of {count['total']}"
                         for notebook, count in claims.accuracy_counts(board).items())
    return (f"<h2>Claims scoreboard</h2><p>Every claim of the two articles, newest measurement per machine from "
            f"the ledger (<code>workbook claims</code>): {html.escape(counts)}.</p>"
            f"<p>Conclusive accuracy verdicts per notebook (yours): {html.escape(accuracy)}.</p><table>{header}"
            f"{rows(evidence, lambda item: item['verdict'])}</table>{smoke_section}")


def run_folder(run: str) -> Path:
    """A run's folder from its id (runs/<id>) or its path."""
    folder = Path(run)
    if not (folder / "summary.json").exists():
        folder = paths.project_root() / "runs" / run
    if not (folder / "summary.json").exists():
        raise FileNotFoundError(f"no run {run!r}: neither {run} nor {folder} holds a summary.json; "
                                "`ls runs/` lists the runs, `workbook run` makes one")
    return folder


def regenerate(run: str) -> Path:
    """`workbook report RUN_ID`: rewrite the run's index.html from summary.json and the ledger."""
    from course_lib import run_summary

    folder = run_folder(run)
    summary = run_summary.read(folder)  # one line when it is cut short or of another shape
    try:
        return write_index(folder, summary["run_id"], summary["profile"], summary["results"],
                           summary.get("not_run", []), summary.get("state", "finished"))
    except OSError as error:  # a full disk or a read-only folder: the page that was there stays (issue 49, 13)
        raise WorkbookError(f"cannot write {folder / 'index.html'} ({error.strerror or error}); free some space or "
                            f"make the folder writable, then run `workbook report {run}` again") from None
