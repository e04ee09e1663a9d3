"""Execute the workbook's notebooks with papermill (https://papermill.readthedocs.io) into
`runs/<id>/`: executed notebooks, their HTML renderings, an `index.html` and ledger rows.

Parameters are checked against each notebook's `parameters` cell (papermill's
`inspect_notebook`) before anything runs; a failed notebook does not stop the others.
"""
from __future__ import annotations

import ast
import functools
import html
import json
import os
import re
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course_lib import ledger, paths
from course_lib.config import FIELD_NAMES, ConfigError, parse_value, resolve_profile

NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_[\w-]+\.ipynb$")
KERNEL_NAME = "python3"
CELL_TIMEOUT_SECONDS = 1800  # one cell; the gpu profile trains for minutes


def notebooks_dir() -> Path:
    return paths.project_root() / "notebooks"


def list_notebooks(folder: Path | None = None, only: str | None = None) -> list[Path]:
    """Numbered notebooks in order; `only="00,03"` keeps those numbers."""
    folder = folder or notebooks_dir()
    found = sorted(p for p in folder.glob("*.ipynb") if NOTEBOOK_PATTERN.match(p.name))
    if only:
        wanted = [part.strip().zfill(2) for part in only.split(",") if part.strip()]
        numbers = {p.name[:2] for p in found}
        missing = [w for w in wanted if w not in numbers]
        if missing:
            raise ConfigError(f"no notebook numbered {missing[0]}; available: {', '.join(sorted(numbers))}")
        found = [p for p in found if p.name[:2] in wanted]
    return found


def notebook_parameters(path: Path) -> dict:
    """The names and defaults of a notebook's `parameters` cell (papermill's inspection)."""
    import papermill

    return papermill.inspect_notebook(str(path))


def _default_type(declared: dict) -> type | None:
    """The type of a parameter's literal default in the notebook (None for `None` or an expression)."""
    try:
        value = ast.literal_eval(declared.get("default", "None"))
    except (ValueError, SyntaxError):
        return None
    return type(value) if isinstance(value, (bool, int, float, str)) else None


def _parse_for_notebook(name: str, text: str, declared: dict) -> object:
    """Type a `-p` value: Config fields by their field type, other parameters by the type of
    their default in the notebook."""
    if name in FIELD_NAMES:
        return parse_value(name, text)
    expected = _default_type(declared)
    if expected is None:  # a default of None or an expression: pass the text through
        return text
    try:
        if expected is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        return expected(text)
    except ValueError:
        raise ConfigError(f"parameter {name} must be {expected.__name__}, got {text!r}") from None


def check_parameters(notebooks: list[Path], assignments: list[str]) -> dict[Path, dict]:
    """Map each notebook to the typed parameters it declares; refuse names none of them declare."""
    declared = {path: notebook_parameters(path) for path in notebooks}
    for path, names in declared.items():
        if "profile" not in names:
            raise ConfigError(f"{path.name} has no `profile` in its parameters cell; add `profile = \"auto\"`")
    per_notebook: dict[Path, dict] = {path: {} for path in notebooks}
    for pair in assignments:
        if "=" not in pair:
            raise ConfigError(f"parameter {pair!r} must look like name=value")
        name, text = (part.strip() for part in pair.split("=", 1))
        if name == "profile":
            raise ConfigError("set the profile with --profile, not -p profile=...")
        takers = [path for path in notebooks if name in declared[path]]
        if not takers:
            valid = sorted({n for names in declared.values() for n in names})
            raise ConfigError(f"unknown parameter {name!r} for the selected notebooks; valid names: {', '.join(valid)}")
        for path in takers:
            per_notebook[path][name] = _parse_for_notebook(name, text, declared[path][name])
    return per_notebook


@dataclass
class NotebookResult:
    notebook: str
    status: str  # ok | failed
    duration_seconds: float
    output: str
    html: str | None = None
    error: str | None = None
    parameters: dict = field(default_factory=dict)


def execute_notebook(path: Path, output: Path, parameters: dict,
                     cell_timeout: int = CELL_TIMEOUT_SECONDS) -> NotebookResult:
    """Run one notebook with papermill; a failure is caught and described, not raised."""
    import papermill

    started = time.perf_counter()
    status, error = "ok", None
    try:
        papermill.execute_notebook(str(path), str(output), parameters=parameters, kernel_name=KERNEL_NAME,
                                   cwd=str(path.parent), progress_bar=False, execution_timeout=cell_timeout)
    except papermill.PapermillExecutionError as failure:
        status, error = "failed", f"cell {failure.exec_count}: {failure.ename}: {failure.evalue}"
    except Exception as failure:  # kernel died, timeout, bad notebook JSON ...
        status, error = "failed", f"{type(failure).__name__}: {failure}".splitlines()[0]
    return NotebookResult(path.name, status, time.perf_counter() - started, output.name, error=error,
                          parameters=parameters)


def to_html(notebook_path: Path) -> Path | None:
    """Render an executed notebook to HTML next to it (nbconvert); None when it cannot."""
    try:
        import nbformat
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter().from_notebook_node(nbformat.read(str(notebook_path), as_version=4))
    except Exception:  # an unreadable notebook is already reported as failed
        return None
    target = notebook_path.with_suffix(".html")
    target.write_text(body, encoding="utf-8")
    return target


def write_index(out_dir: Path, run_id: str, profile: str, results: list[NotebookResult]) -> Path:
    rows = []
    for r in results:
        links = f'<a href="{html.escape(r.output)}">ipynb</a>'
        if r.html:
            links = f'<a href="{html.escape(r.html)}">{html.escape(r.notebook)}</a> ({links})'
        else:
            links = f"{html.escape(r.notebook)} ({links})"
        colour = "#1a7f37" if r.status == "ok" else "#cf222e"
        params = html.escape(", ".join(f"{k}={v}" for k, v in r.parameters.items()))
        rows.append(f"<tr><td>{links}</td><td style='color:{colour}'>{r.status}</td>"
                    f"<td>{r.duration_seconds:.1f}</td><td>{params}</td><td>{html.escape(r.error or '')}</td></tr>")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Workbook run {html.escape(run_id)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}</style></head><body>
<h1>Workbook run {html.escape(run_id)}</h1>
<p>Profile <b>{html.escape(profile)}</b> on {html.escape(ledger.describe_hardware())};
torch {html.escape(str(ledger.runtime_versions()['torch']))}; commit {html.escape(str(ledger.git_commit()))}.</p>
<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>parameters</th><th>error</th></tr>
{''.join(rows)}
</table></body></html>
"""
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def new_run_id(profile: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{profile}-{secrets.token_hex(2)}"


def run_workbook(profile: str = "auto", only: str | None = None, assignments: list[str] | None = None,
                 out_dir: str | os.PathLike | None = None, notebooks_folder: Path | None = None,
                 cell_timeout: int = CELL_TIMEOUT_SECONDS,
                 echo=functools.partial(print, flush=True)) -> tuple[Path, list[NotebookResult]]:
    """Check parameters, then execute the notebooks in order. Returns (run folder, results)."""
    resolved = resolve_profile(profile)
    notebooks = list_notebooks(notebooks_folder, only)
    if not notebooks:
        raise FileNotFoundError(f"no numbered notebooks (NN_name.ipynb) in {notebooks_folder or notebooks_dir()}")
    per_notebook = check_parameters(notebooks, assignments or [])  # before anything runs

    run_id = new_run_id(resolved)
    out = Path(out_dir) if out_dir else paths.project_root() / "runs" / run_id
    out.mkdir(parents=True, exist_ok=True)
    # Kernels inherit the environment: they write into the same ledger, tagged with this run.
    ledger_path = ledger.default_path().resolve()
    os.environ[ledger.LEDGER_ENV] = str(ledger_path)
    os.environ[ledger.RUN_ID_ENV] = run_id
    os.environ[ledger.PROFILE_ENV] = resolved
    book = ledger.Ledger(ledger_path)

    results = []
    for path in notebooks:
        parameters = {"profile": resolved, **per_notebook[path]}
        echo(f"[{run_id}] {path.name} ...")
        result = execute_notebook(path, out / path.name, parameters, cell_timeout)
        html_path = to_html(out / path.name) if (out / path.name).exists() else None
        result.html = html_path.name if html_path else None
        book.record("notebook", path.name, status=result.status, duration_seconds=result.duration_seconds,
                    parameters=parameters, metrics={"error": result.error} if result.error else {},
                    profile=resolved, run_id=run_id)
        echo(f"    {result.status} in {result.duration_seconds:.1f} s" + (f": {result.error}" if result.error else ""))
        results.append(result)
    write_index(out, run_id, resolved, results)
    (out / "summary.json").write_text(json.dumps(
        {"run_id": run_id, "profile": resolved, "results": [asdict(r) for r in results]}, indent=2))
    return out, results


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("run", help="execute the notebooks with papermill into runs/<id>/")
    parser.add_argument("--profile", default="auto", help="smoke | cpu | gpu | auto (default: auto)")
    parser.add_argument("--only", help="comma-separated notebook numbers, e.g. 00,03")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a notebook parameter, checked against the parameters cells (repeatable)")
    parser.add_argument("--out", help="output folder (default: runs/<run id>)")
    parser.add_argument("--cell-timeout", type=int, default=CELL_TIMEOUT_SECONDS, help="seconds per cell")
    parser.set_defaults(func=_cli)


def _cli(args) -> int:
    out, results = run_workbook(args.profile, args.only, args.param, args.out, cell_timeout=args.cell_timeout)
    failed = [r.notebook for r in results if r.status != "ok"]
    print(f"index: {out / 'index.html'}")
    if failed:
        print(f"workbook run: {len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
