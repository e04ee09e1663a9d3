"""Execute the workbook's notebooks with papermill (https://papermill.readthedocs.io) into
`runs/<id>/`: executed notebooks, their HTML renderings, an `index.html` and ledger rows.

Parameters are checked against each notebook's `parameters` cell (papermill's
`inspect_notebook`) before anything runs: names, types (a notebook-only parameter is typed by its
literal default, `NotebookParameter`) and the values Config accepts. A failed notebook does not
stop the others; `index.html` and `summary.json` are rewritten after every notebook, so a run
stopped by Ctrl-C (`RunInterrupted`) or a crash still leaves a page of what ran. Before anything
runs, every notebook must parse (a broken one is named with its line and column), the output
folder must be writable and the ledger sound. While they run, each notebook prints a start line, a cell counter and its
status with the duration (`NotebookProgress`), and a warning naming any cell that prints nothing for
a minute, nothing else: kernels are reached over Unix
sockets (`kernel_transport`), so ipykernel has no TCP warning to print.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course_lib import ledger, paths, report
from course_lib.config import (FIELD_NAMES, REHEARSAL_ENV, REHEARSAL_SWITCHES, ConfigError, make_config, parse_bool,
                               parse_number, parse_value, plural, refuse_repeated, resolve_profile, unknown_name)

NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_[\w-]+\.ipynb$")
KERNEL_NAME = "python3"
CELL_TIMEOUT_SECONDS = 1800  # one cell; the gpu profile trains for minutes
# One cell of the reference profile: 07's variant loop trains 25 runs of 60 epochs (about 65 minutes on 2 cores);
# its first run stopped at the 30-minute limit above. --cell-timeout still overrides it.
REFERENCE_CELL_TIMEOUT_SECONDS = 6 * 3600
PIPED_PROGRESS_SECONDS = 60  # at most one cell-counter line per notebook this often when stdout is not a terminal
SILENT_CELL_SECONDS = 60  # a cell that sends no output (text, display, widget update) this long is named in a warning
CLEAR_TO_END_OF_LINE = "\x1b[K"  # ANSI: erase what a longer previous counter left on the line


def notebooks_dir() -> Path:
    return paths.project_root() / "notebooks"


def list_notebooks(folder: Path | None = None, only: str | None = None) -> list[Path]:
    """Numbered notebooks in order; `only="00,03"` keeps those numbers."""
    folder = folder or notebooks_dir()
    found = sorted(p for p in folder.glob("*.ipynb") if NOTEBOOK_PATTERN.match(p.name))
    if only is not None:
        wanted = [part.strip().zfill(2) for part in only.split(",") if part.strip()]
        if not wanted:
            raise ConfigError(f"--only {only!r} names no notebook; give numbers like 00,03, or leave --only out "
                              "to run them all")
        numbers = {p.name[:2] for p in found}
        missing = [w for w in wanted if w not in numbers]
        if missing:
            raise ConfigError(f"no notebook numbered {missing[0]}; available: {', '.join(sorted(numbers))}")
        found = [p for p in found if p.name[:2] in wanted]
    return found


def check_notebook_file(path: Path) -> None:
    """ConfigError naming `path` and where it breaks when it is not a readable notebook (broken
    JSON from a merge or a hand edit, or JSON that is not nbformat)."""
    import nbformat

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} cannot be read ({error}); restore it (git checkout -- {path.name})") from None
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON (line {error.lineno} column {error.colno}: {error.msg}); "
                          f"fix it or restore it (git checkout -- {path.name})") from None
    try:
        nbformat.reads(text, as_version=4)
    except Exception as error:  # nbformat raises several kinds for JSON that is not a notebook
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise ConfigError(f"{path} is JSON but not a notebook ({first}); restore it "
                          f"(git checkout -- {path.name})") from None


def notebook_parameters(path: Path) -> dict:
    """The names and defaults of a notebook's `parameters` cell (papermill's inspection)."""
    import papermill

    return papermill.inspect_notebook(str(path))


# A comment that starts with `a | b | c` lists the values a string parameter accepts.
CHOICES_COMMENT = re.compile(r"^\s*([\w.-]+(?:\s*\|\s*[\w.-]+)+)(?![\w.-])")
# A comment that starts with `list of int` (float, str) types the items of an empty list default.
LIST_COMMENT = re.compile(r"^\s*list of (int|float|str)\b")
# Typed defaults a notebook-only parameter may have (papermill injects their repr).
PARAMETER_TYPES = (bool, int, float, str, list)


def _or_list(words) -> str:
    words = [str(w) for w in words]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


@dataclass(frozen=True)
class NotebookParameter:
    """One assignment of a notebook's `parameters` cell, typed by its literal default.

    Config fields may default to None ("the profile's value"): Config types them. Every other
    parameter needs a literal default whose type `-p name=value` must match: bool, int, float,
    str or list. A string whose comment starts with choices (`auto | true | false`) accepts only
    those; `true` and `false` among them arrive as the bools True and False.
    """

    notebook: str
    name: str
    default_text: str  # the default as written in the cell
    comment: str = ""

    @classmethod
    def from_papermill(cls, notebook: str, name: str, declared: dict) -> NotebookParameter:
        return cls(notebook, name, declared.get("default", "None"), declared.get("help", "") or "")

    @property
    def is_config_field(self) -> bool:
        return self.name in FIELD_NAMES

    @property
    def default(self):
        """The literal default; ValueError or SyntaxError when it is an expression."""
        return ast.literal_eval(self.default_text)

    @property
    def choices(self) -> tuple[str, ...]:
        match = CHOICES_COMMENT.match(self.comment)
        return tuple(word.strip() for word in match.group(1).split("|")) if match else ()

    @property
    def element_type(self) -> type | None:
        """The type every item of a list parameter must have: that of the default's items, or for an
        empty default the one its comment names (`list of int ...`); None when neither says."""
        kinds = {type(item) for item in self.default}
        if len(kinds) == 1:
            return kinds.pop()
        match = LIST_COMMENT.match(self.comment)
        return {"int": int, "float": float, "str": str}[match.group(1)] if match and not kinds else None

    def problem(self) -> str | None:
        """What is wrong with the declaration itself, as a one-line fix; None when it is fine."""
        if self.is_config_field or self.name == "profile":
            return None
        where = f"{self.notebook}: parameter {self.name}"
        try:
            default = self.default
        except (ValueError, SyntaxError):
            return f"{where} defaults to the expression {self.default_text}; give it a literal default"
        if default is None:
            return (f"{where} defaults to None, so -p values cannot be typed; give it a typed default "
                    '("auto" for a choice, 0 for an automatic count or size, [] for an automatic list)')
        if not isinstance(default, PARAMETER_TYPES):
            return f"{where} defaults to a {type(default).__name__}; use a bool, int, float, str or list"
        if isinstance(default, str) and self.choices and default not in self.choices:
            return f"{where} defaults to {default!r}, which is not among its choices {' | '.join(self.choices)}"
        return None

    def parse(self, text: str):
        """The value of `-p name=text`, typed like the default; ConfigError naming the fix otherwise."""
        if self.is_config_field:
            return parse_value(self.name, text)
        problem = self.problem()
        if problem:
            raise ConfigError(problem)
        default = self.default
        if isinstance(default, str) and self.choices:
            return self._parse_choice(text)
        kind = type(default)
        try:
            if kind is bool:
                return parse_bool(text)
            if kind is list:
                value = ast.literal_eval(text.strip())
                if not isinstance(value, list):
                    raise ValueError
                element_type = self.element_type
                # type(), not isinstance: True is an int to isinstance, and no count or size is meant by it.
                if element_type is not None and not all(type(item) is element_type for item in value):
                    raise ValueError
                return value
            return parse_number(kind, text) if kind in (int, float) else kind(text)
        except (ValueError, SyntaxError, TypeError):  # TypeError: literal_eval of e.g. {[1]: 2}
            raise ConfigError(f"{self.name} must be {self._expected()}, got {text!r}") from None

    def _parse_choice(self, text: str):
        choices = self.choices
        if "true" in choices and "false" in choices:
            try:
                return parse_bool(text)
            except ValueError:
                pass
        if text.strip() in choices:
            return text.strip()
        raise ConfigError(f"{self.name} must be {_or_list(choices)}, got {text!r}")

    def _expected(self) -> str:
        default = self.default
        if isinstance(default, bool):
            return "true or false"
        if isinstance(default, list):
            example = default or {int: [1, 2], float: [0.1, 0.5], str: ["a", "b"]}.get(self.element_type, [1, 2])
            kind = self.element_type
            return f"a list of {kind.__name__} like {example}" if kind else f"a list like {example}"
        return {int: "an integer", float: "a number"}.get(type(default), type(default).__name__)


REFERENCE = "reference"  # the profile of the long accuracy studies (config.PROFILES)


def offers_reference(path: Path) -> bool:
    """Whether a notebook's `profile` parameter lists `reference` among its choices: its accuracy studies
    have reference sizes (converged models, at least 5 seeds)."""
    declared = declared_parameters(path).get("profile")
    return declared is not None and REFERENCE in declared.choices


def reference_notebooks(notebooks: list[Path], chosen: bool) -> list[Path]:
    """What `workbook run --profile reference` runs: of the notebooks asked for, those that offer the profile.
    Without --only the others are left out (their cpu run is their reference); a notebook named with --only
    that does not offer it is refused in one line, before any kernel starts."""
    offering = [path for path in notebooks if offers_reference(path)]
    missing = [path.name[:2] for path in notebooks if path not in offering]
    if chosen and missing:
        raise ConfigError(f"notebook(s) {', '.join(missing)} have no reference sizes (their cpu run is their reference); "
                          f"the reference profile runs {', '.join(p.name[:2] for p in offering) or 'none of those asked for'}"
                          f"; use --profile cpu for them")
    if not offering:
        raise ConfigError("none of the selected notebooks offers the reference profile")
    return offering


def declared_parameters(path: Path) -> dict[str, NotebookParameter]:
    """The parameters a notebook declares, in the cell's order."""
    return {name: NotebookParameter.from_papermill(path.name, name, declared)
            for name, declared in notebook_parameters(path).items()}


def check_parameters(notebooks: list[Path], assignments: list[str], profile: str | None = None) -> dict[Path, dict]:
    """Map each notebook to the typed parameters it declares; refuse names none of them declare
    and values their notebooks cannot take. With `profile`, the Config fields among them are
    also built into a Config once, so a value Config refuses (e.g. batch_size=0) stops the run
    before any kernel starts."""
    declared = {path: declared_parameters(path) for path in notebooks}
    for path, names in declared.items():
        if "profile" not in names:
            raise ConfigError(f"{path.name} has no `profile` in its parameters cell; add `profile = \"auto\"`")
    per_notebook: dict[Path, dict] = {path: {} for path in notebooks}
    config_values = {}
    given = {}
    for pair in assignments:
        if "=" not in pair:
            raise ConfigError(f"parameter {pair!r} must look like name=value")
        name, text = (part.strip() for part in pair.split("=", 1))
        refuse_repeated(name, given, text)
        given[name] = text
        if name == "profile":
            raise ConfigError("set the profile with --profile, not -p profile=...")
        takers = [path for path in notebooks if name in declared[path]]
        if not takers:
            valid = sorted({n for names in declared.values() for n in names})
            raise ConfigError(unknown_name("parameter", name, valid, " for the selected notebooks"))
        for path in takers:
            per_notebook[path][name] = declared[path][name].parse(text)
        if name in FIELD_NAMES:
            config_values[name] = per_notebook[takers[0]][name]
    if profile is not None:
        make_config(profile, **config_values)  # raises ConfigError naming the first bad value
    return per_notebook


@dataclass
class NotebookResult:
    notebook: str
    status: str  # ok | failed | interrupted
    duration_seconds: float
    output: str
    html: str | None = None
    error: str | None = None
    parameters: dict = field(default_factory=dict)
    kernel_log: str | None = None  # what the kernel process wrote outside the notebook (`execute_notebook`)


def code_cell_count(path: Path) -> int:
    """Code cells papermill will execute: the notebook's non-empty ones plus the parameters cell it injects."""
    import nbformat

    cells = nbformat.read(str(path), as_version=4).cells
    return 1 + sum(1 for c in cells if c.cell_type == "code" and c.source.strip()
                   and "injected-parameters" not in c.metadata.get("tags", []))


# jupyter_client interrupts every kernel before shutting it down (KernelManager.shutdown_kernel sends
# SIGINT first); when that lands while the kernel is still handling a message, ipykernel logs "KeyboardInterrupt
# caught in kernel" on the stderr the kernel shares with `workbook run`, after the notebook has finished. The
# kernel's own log is therefore kept to critical messages: a cell's error reaches papermill as a message, not
# through this log, so no failure is hidden.
KERNEL_ARGUMENTS = ("--IPKernelApp.log_level=CRITICAL",)


@contextlib.contextmanager
def kernel_transport():
    """papermill engine options that connect to the kernel over Unix sockets in a private folder.

    jupyter_client's default transport is TCP on 127.0.0.1, and ipykernel then prints "Kernel is
    running over TCP without encryption" for every notebook. ZeroMQ's IPC transport uses Unix
    domain sockets instead, here in a folder only this user can open (mkdtemp makes it 0700), so
    there is nothing to warn about. Short paths: a socket path must stay under about 100 bytes.
    ZeroMQ has no IPC transport on Windows, which keeps TCP (and the warning).
    """
    if os.name != "posix":
        yield {}
        return
    from traitlets.config import Config

    folder = tempfile.mkdtemp(prefix="workbook-kernel-")
    try:
        yield {"config": Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "kernel")}})}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def exported(values: dict[str, str]):
    """Environment variables for the kernels this process starts (they inherit it), set for the block and
    restored afterwards, so nothing a run exports outlives it in the caller's process."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def profile_for_kernels(profile: str | None):
    """Export the notebook's profile (`auto` resolved) as WORKBOOK_PROFILE while a kernel runs, so the
    ledger rows it writes (claims above all) say which profile they were measured in; restored after."""
    with exported({} if profile is None else {ledger.PROFILE_ENV: resolve_profile(profile)}):
        yield


@contextlib.contextmanager
def rehearsal_kernel(profile: str | None):
    """The profile the notebook itself gets: for `rehearsal`, smoke (its CI-sized branches), with
    REHEARSAL_ENV set while the kernel runs so that every smoke Config it builds carries the gpu
    profile's switches (`config.REHEARSAL_SWITCHES`); any other profile unchanged."""
    if profile != "rehearsal":
        yield profile
        return
    with exported({REHEARSAL_ENV: "1"}):
        yield "smoke"


def rehearsal_line() -> str:
    """What `workbook run --profile rehearsal` runs with, and each CUDA-only call it skips, with why."""
    from course_lib import devices

    switches = ", ".join(f"{name}={value}" for name, value in REHEARSAL_SWITCHES.items())
    skipped = "; ".join(devices.skipped_switches(make_config("rehearsal"), "cpu"))
    return (f"rehearsal: every notebook's smoke branches on the CPU with the gpu profile's switches ({switches}); "
            f"skipped, CUDA only: {skipped}")


WATCHING_ENGINE = "workbook-watching"  # the papermill engine `watching_engine` registers
# Kernel messages that are not output: the busy/idle status and the echo of the cell's code.
NOT_OUTPUT_MESSAGES = frozenset({"status", "execute_input"})


@functools.cache
def watching_engine() -> str:
    """Register (once) and name a papermill engine whose client calls `on_output()` for every output
    message a cell sends: printed text, a display, a widget update (a tqdm bar in a notebook is a
    widget), a cleared output, and that starts the kernel with its process's stdout and stderr on
    `kernel_output` (a file) when given. papermill's own engine (`NBClientEngine`) builds its client inline,
    so the engine is its three lines again with the subclass in place (papermill.engines, 2.x)."""
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, logger, papermill_engines
    from papermill.utils import merge_kwargs, remove_args
    from traitlets import Callable

    class WatchingClient(PapermillNotebookClient):
        on_output = Callable(default_value=None, allow_none=True).tag(config=True)

        def process_message(self, msg, cell, cell_index):
            if self.on_output is not None and msg["msg_type"] not in NOT_OUTPUT_MESSAGES:
                self.on_output()
            return super().process_message(msg, cell, cell_index)

    class WatchingEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                     stderr_file=None, start_timeout=60, execution_timeout=None,
                                     kernel_output=None, **kwargs):
            timeout = execution_timeout or kwargs.get("timeout")
            kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
            options = merge_kwargs(kwargs, timeout=timeout, startup_timeout=start_timeout,
                                   kernel_name=kernel_name, log=logger, log_output=log_output,
                                   stdout_file=stdout_file, stderr_file=stderr_file)
            # The kernel process's own stdout and stderr (jupyter_client's launch_kernel hands them to Popen).
            launch = {} if kernel_output is None else {"stdout": kernel_output, "stderr": kernel_output}
            return WatchingClient(nb_man, **options).execute(**launch)

    papermill_engines.register(WATCHING_ENGINE, WatchingEngine)
    return WATCHING_ENGINE


def execute_notebook(path: Path, output: Path, parameters: dict, cell_timeout: int = CELL_TIMEOUT_SECONDS,
                     on_cell=None, on_output=None) -> NotebookResult:
    """Run one notebook with papermill; a failure is caught and described, not raised.
    `on_cell(number, source)` is called as each code cell starts (1-based, the injected parameters cell
    included, with the cell's code), `on_output()` for each output a cell sends (`watching_engine`).
    The kernel sees `parameters["profile"]` as WORKBOOK_PROFILE (`profile_for_kernels`). The
    `rehearsal` profile runs the notebook with profile smoke and the gpu profile's switches
    (`rehearsal_kernel`).

    The kernel process's own stdout and stderr (C libraries and worker processes writing to the file
    descriptors, not to the notebook: a C++ warning, libzmq's abort at a kernel's shutdown) go to
    `<output>.kernel.log` beside the executed notebook, kept only when not empty
    (`NotebookResult.kernel_log`), instead of into the terminal of whoever runs it."""
    import papermill

    started = time.perf_counter()
    status, error = "ok", None
    hooks = {"engine_name": watching_engine()}
    if on_cell is not None:
        numbers = itertools.count(1)
        # nbclient calls on_cell_execute just before it sends a non-empty code cell to the kernel.
        hooks["on_cell_execute"] = lambda cell, cell_index: on_cell(next(numbers), cell.source)
    if on_output is not None:
        hooks["on_output"] = on_output
    kernel_log = output.with_suffix(".kernel.log")
    try:
        with kernel_transport() as transport, profile_for_kernels(parameters.get("profile")), \
                rehearsal_kernel(parameters.get("profile")) as kernel_profile, open(kernel_log, "wb") as kernel_output:
            papermill.execute_notebook(str(path), str(output), parameters={**parameters, "profile": kernel_profile},
                                       kernel_name=KERNEL_NAME,
                                       cwd=str(path.parent), progress_bar=False, execution_timeout=cell_timeout,
                                       extra_arguments=list(KERNEL_ARGUMENTS), kernel_output=kernel_output,
                                       **transport, **hooks)
    except papermill.PapermillExecutionError as failure:
        status, error = "failed", f"cell {failure.exec_count}: {failure.ename}: {failure.evalue}"
    except Exception as failure:  # kernel died, timeout, bad notebook JSON, the log's folder missing ...
        status, error = "failed", f"{type(failure).__name__}: {failure}".splitlines()[0]
    kept = kernel_log.is_file() and kernel_log.stat().st_size > 0
    if not kept:
        kernel_log.unlink(missing_ok=True)
    return NotebookResult(path.name, status, time.perf_counter() - started, output.name, error=error,
                          parameters=parameters, kernel_log=kernel_log.name if kept else None)


def format_duration(seconds: float) -> str:
    """`7.6 s`, `3 min 05 s`, `1 h 02 min`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, whole_seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {whole_seconds:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class NotebookProgress:
    """What `workbook run` prints for one notebook: a start line, a cell counter, a warning when a
    cell has sent no output for `silence` seconds and, at the end, the status with the duration.

    On a terminal the counter is one line rewritten in place every second (`\\r`), and the final
    line replaces it. Piped (CI logs, `| tee`) there is no carriage return: a counter line at most
    every `interval` seconds, long cells included (`interval=0`: one line per cell). The silence
    warning names the cell (number and first line of code) once per silent stretch: output from
    the cell (`on_output`) or the next cell starts the watch again (`silence=0`: no warning).
    """

    def __init__(self, path: Path, total_cells: int, stream=None, interactive: bool | None = None,
                 interval: float = PIPED_PROGRESS_SECONDS, clock=time.monotonic,
                 silence: float = SILENT_CELL_SECONDS):
        self.tag = f"[{path.name[:2]}] {path.stem}"
        self.total_cells = total_cells
        self.stream = stream or sys.stdout
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.interval = interval
        self.silence = silence
        self.clock = clock
        self.cell = 0
        self.cell_code = ""  # first line of the running cell's code, for the silence warning
        self.started = self.last_line = self.last_output = None
        self.warned = False  # already warned about this silent stretch
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = None

    def elapsed(self) -> float:
        return self.clock() - self.started

    def counter_line(self) -> str:
        return f"{self.tag}: cell {self.cell}/{self.total_cells}, {format_duration(self.elapsed())}"

    def silence_line(self, seconds: float) -> str:
        code = f" ({self.cell_code})" if self.cell_code else ""
        return (f"{self.tag}: warning: cell {self.cell}/{self.total_cells}{code} has printed nothing for "
                f"{format_duration(seconds)}; it is still running (Ctrl-C stops the run)")

    def start(self, ticking: bool = True) -> None:
        """Print the start line; with `ticking`, a thread refreshes the counter during long cells."""
        self.started = self.last_line = self.last_output = self.clock()
        self._write(f"{self.tag}: started at {time.strftime('%H:%M:%S')}, {self.total_cells} code cells\n")
        if ticking:
            self._ticker = threading.Thread(target=self._tick_until_stopped, daemon=True)
            self._ticker.start()

    def on_cell(self, number: int, source: str = "") -> None:
        with self._lock:
            self.cell = number
            lines = [line.strip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
            self.cell_code = (lines[0][:60] + ("..." if len(lines[0]) > 60 else "")) if lines else ""
            self.last_output, self.warned = self.clock(), False
            self._show(new_cell=True)

    def on_output(self) -> None:
        """The running cell sent output (called from papermill's client, in the main thread)."""
        with self._lock:
            self.last_output, self.warned = self.clock(), False

    def tick(self) -> None:
        with self._lock:
            self._warn_if_silent()
            self._show(new_cell=False)

    def finish(self, status: str, seconds: float, error: str | None = None) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        line = f"{self.tag}: {status} in {format_duration(seconds)}" + (f": {error}" if error else "")
        with self._lock:
            self._write(("\r" + line + CLEAR_TO_END_OF_LINE if self.interactive else line) + "\n")

    def _warn_if_silent(self) -> None:
        if self.started is None or self.cell == 0 or self.silence <= 0 or self.warned:
            return
        silent = self.clock() - self.last_output
        if silent >= self.silence:
            self.warned = True
            line = self.silence_line(silent)
            self._write(("\r" + line + CLEAR_TO_END_OF_LINE if self.interactive else line) + "\n")

    def _show(self, new_cell: bool) -> None:
        if self.started is None or self.cell == 0:
            return
        now = self.clock()
        if self.interactive:
            width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be rewritten
            self._write("\r" + self.counter_line()[:width] + CLEAR_TO_END_OF_LINE)
        elif (new_cell and self.interval <= 0) or (self.interval > 0 and now - self.last_line >= self.interval):
            self._write(self.counter_line() + "\n")
            self.last_line = now

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _tick_until_stopped(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()


def to_html(notebook_path: Path) -> Path | None:
    """Render an executed notebook to HTML next to it (nbconvert), widgets as their static forms
    (`report.without_widgets`); None when it cannot."""
    try:
        import nbformat
        from nbconvert import HTMLExporter

        # static: the explorer's picture in place of its widget, no widget script from a CDN
        body, _ = HTMLExporter().from_notebook_node(report.without_widgets(nbformat.read(str(notebook_path),
                                                                                         as_version=4)))
    except Exception:  # an unreadable notebook is already reported as failed
        return None
    target = notebook_path.with_suffix(".html")
    try:
        paths.write_atomically(target, body)
    except OSError as error:  # a full disk: the notebook ran, its result is kept without the rendering
        print(f"workbook run: warning: {target.name} was not written ({error.strerror or error}); "
              f"the executed notebook {notebook_path.name} and its result are kept", file=sys.stderr, flush=True)
        return None
    return target


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP during `workbook run`: the notebook that was running is marked
    interrupted, and `out/index.html` and `summary.json` list what ran. `exit_code` is the shell's
    128 + the signal's number (130 for Ctrl-C)."""

    def __init__(self, out: Path, results: list[NotebookResult], reason: str = "interrupted",
                 exit_code: int = 128 + signal.SIGINT):
        super().__init__(f"{reason}; the notebooks run so far are listed in {out / 'index.html'}")
        self.out, self.results, self.exit_code = out, results, exit_code


class Stopped(KeyboardInterrupt):
    """SIGTERM (a `kill`, a scheduler's time limit) or SIGHUP (the terminal closed), raised in the
    runner like Ctrl-C's KeyboardInterrupt, so the run is reported instead of left "running"."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _handled_signals(handler, signals):
    """Install `handler` for `signals` while the block runs (main thread only: Python's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, handler) for number in signals}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def _stopping_anyway(stream):
    """While an interrupted run writes its report, a second Ctrl-C (or SIGTERM) is noted, not obeyed:
    obeying it would leave the report half-written and the interrupted notebook unrecorded."""
    def note(signum, frame):
        print(f"workbook run: {signal.Signals(signum).name} again; already stopping, writing the report first",
              file=stream, flush=True)
    return note


def write_index(out_dir: Path, run_id: str, profile: str, results: list[NotebookResult],
                not_run: list[str] = (), state: str = "finished") -> Path:
    """index.html as the run stands: status, duration, headline numbers, claims and key figure of
    each notebook (`report.write_index`)."""
    return report.write_index(out_dir, run_id, profile, [asdict(r) for r in results], not_run, state)


def write_reports(out_dir: Path, run_id: str, profile: str, results: list[NotebookResult],
                  not_run: list[str] = (), state: str = "finished") -> None:
    """index.html and summary.json as the run stands. A disk that cannot take them (full) is a warning:
    the notebooks go on, and the ledger keeps their rows (or its unsaved-rows file, or the warning itself)."""
    try:
        write_index(out_dir, run_id, profile, results, not_run, state)
        paths.write_atomically(out_dir / "summary.json", json.dumps(
            {"run_id": run_id, "profile": profile, "state": state, "results": [asdict(r) for r in results],
             "not_run": list(not_run)}, indent=2))
    except OSError as error:
        print(f"workbook run: warning: {out_dir / 'summary.json'} and index.html were not updated "
              f"({error.strerror or error}); the ledger keeps each notebook's row", file=sys.stderr, flush=True)


def new_run_id(profile: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{profile}-{secrets.token_hex(2)}"


def run_workbook(profile: str = "auto", only: str | None = None, assignments: list[str] | None = None,
                 out_dir: str | os.PathLike | None = None, notebooks_folder: Path | None = None,
                 cell_timeout: int | None = None, stream=None,
                 progress_interval: float = PIPED_PROGRESS_SECONDS,
                 silence_seconds: float = SILENT_CELL_SECONDS) -> tuple[Path, list[NotebookResult]]:
    """Check the notebooks, parameters, output folder and ledger, then execute the notebooks in
    order, printing each one's progress (`NotebookProgress`; a warning for a cell silent for
    `silence_seconds`, 0 = never) to `stream` (default stdout) and
    rewriting index.html and summary.json after each. Returns (run folder, results); Ctrl-C
    raises RunInterrupted after the reports are written."""
    resolved, notebooks, cell_timeout, per_notebook = _checked_plan(profile, only, assignments, notebooks_folder,
                                                                    cell_timeout, silence_seconds)
    run_id = new_run_id(resolved)
    out = paths.check_writable(Path(out_dir).resolve() if out_dir else paths.project_root() / "runs" / run_id,
                               "--out another folder")
    ledger_path = ledger.check_writable(ledger.default_path().resolve())
    # Kernels inherit the environment: they write into the same ledger, tagged with this run (for the run only).
    with exported({ledger.LEDGER_ENV: str(ledger_path), ledger.RUN_ID_ENV: run_id, ledger.PROFILE_ENV: resolved}):
        book = ledger.Ledger(ledger_path)
        stream = stream or sys.stdout
        print(f"workbook run {run_id}: {plural(len(notebooks), 'notebook')}, profile {resolved}, into {out}", file=stream,
              flush=True)
        if resolved == "rehearsal":
            print(rehearsal_line(), file=stream, flush=True)

        results: list[NotebookResult] = []
        running = None  # (number, path, parameters, progress) of the notebook whose kernel is running
        with _handled_signals(_raise_stopped, STOP_SIGNALS):
            try:
                write_reports(out, run_id, resolved, results, [p.name for p in notebooks], state="running")
                for number, path in enumerate(notebooks):
                    parameters = {"profile": resolved, **per_notebook[path]}
                    progress = NotebookProgress(path, code_cell_count(path), stream, interval=progress_interval,
                                                silence=silence_seconds)
                    running = (number, path, parameters, progress)
                    progress.start()
                    result = execute_notebook(path, out / path.name, parameters, cell_timeout, on_cell=progress.on_cell,
                                              on_output=progress.on_output)
                    running = None  # finished: what follows only records it
                    progress.finish(result.status, result.duration_seconds, result.error)
                    if result.kernel_log:
                        print(f"{progress.tag}: its kernel process also wrote outside the notebook: "
                              f"{out / result.kernel_log}", file=stream, flush=True)
                    results.append(result)
                    _keep(result, out, book, parameters, resolved, run_id, ledger_status=result.status)
                    remaining = [p.name for p in notebooks[number + 1:]]
                    write_reports(out, run_id, resolved, results, remaining,
                                  state="running" if remaining else "finished")
            # Ctrl-C, SIGTERM, SIGHUP (or the process being told to exit): report, then stop
            except BaseException as stop:
                with _handled_signals(_stopping_anyway(stream), (signal.SIGINT, *STOP_SIGNALS)):
                    _report_interrupted(stop, running, results, notebooks, out, book, resolved, run_id)
                if isinstance(stop, Stopped):
                    raise RunInterrupted(out, results, f"stopped by {stop}", 128 + stop.signum) from None
                if isinstance(stop, KeyboardInterrupt):
                    raise RunInterrupted(out, results) from None
                raise
        return out, results


def _checked_plan(profile: str, only, assignments, notebooks_folder, cell_timeout, silence_seconds) -> tuple:
    """Everything checked before anything runs: (profile, notebooks, cell timeout, parameters per notebook). A broken
    notebook, an unknown parameter or a notebook without reference sizes is named in one line, not a traceback."""
    if not silence_seconds >= 0:  # also refuses NaN
        raise ConfigError(f"--silent-cell-warning must be a number of seconds, or 0 for no warning; "
                          f"got {silence_seconds:g}")
    resolved = resolve_profile(profile)
    notebooks = list_notebooks(notebooks_folder, only)
    if not notebooks:
        raise FileNotFoundError(f"no numbered notebooks (NN_name.ipynb) in {notebooks_folder or notebooks_dir()}")
    for path in notebooks:
        check_notebook_file(path)
    if resolved == REFERENCE:
        notebooks = reference_notebooks(notebooks, chosen=only is not None)
    if cell_timeout is None:  # not given: the profile's
        cell_timeout = REFERENCE_CELL_TIMEOUT_SECONDS if resolved == REFERENCE else CELL_TIMEOUT_SECONDS
    return resolved, notebooks, cell_timeout, check_parameters(notebooks, assignments or [], profile=resolved)


def _report_interrupted(stop: BaseException, running, results: list, notebooks: list[Path], out: Path, book,
                        resolved: str, run_id: str) -> None:
    """After Ctrl-C or a signal: the running notebook recorded as interrupted, and the reports written."""
    if running is not None:
        _, path, parameters, progress = running
        seconds = progress.elapsed()
        progress.finish("interrupted", seconds)
        result = NotebookResult(path.name, "interrupted", seconds, path.name, error=_stop_reason(stop),
                                parameters=parameters)
        results.append(result)
        _keep(result, out, book, parameters, resolved, run_id, ledger_status="failed")
    done = {r.notebook for r in results}
    write_reports(out, run_id, resolved, results, [p.name for p in notebooks if p.name not in done],
                  state="interrupted")


def _stop_reason(stop: BaseException) -> str:
    if isinstance(stop, Stopped):
        return f"stopped by {stop} (kill, a scheduler's time limit, or the terminal closed)"
    return "interrupted (Ctrl-C)" if isinstance(stop, KeyboardInterrupt) else type(stop).__name__


def _keep(result: NotebookResult, out: Path, book, parameters: dict, profile: str, run_id: str,
          ledger_status: str) -> None:
    """The notebook's HTML rendering and its ledger row."""
    # The row first: the HTML is the step a full disk breaks, and the result must not depend on it.
    book.record("notebook", result.notebook, status=ledger_status, duration_seconds=result.duration_seconds,
                parameters=parameters, metrics={"error": result.error} if result.error else {},
                profile=profile, run_id=run_id)
    executed = out / result.output
    html_path = to_html(executed) if executed.exists() else None
    result.html = html_path.name if html_path else None
