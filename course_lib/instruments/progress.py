"""Progress of the calls that take more than a few seconds (a grid of fits, an ablation, a seed loop,
an epoch): a tqdm bar (https://tqdm.github.io) in a notebook (a widget, `tqdm.auto`) or on a
terminal, and plain lines, without carriage returns, when the output is a pipe or a file (a CI log,
`workbook train | tee train.log`): one every `interval` seconds, plus a start and an end line for
an outer loop (`leave=True`).
"""
from __future__ import annotations

import sys
import time

PLAIN_LINE_SECONDS = 10.0  # at most one plain line per bar this often


def in_notebook() -> bool:
    """True inside a Jupyter kernel (ipykernel; papermill's too), where tqdm.auto draws a widget."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, whole = divmod(round(seconds), 60)
    return f"{minutes} min {whole:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """One long call's progress, with tqdm's verbs: `update(n)`, `set_postfix(loss=...)` or
    `set_postfix_str("what runs now")`, `close()` (or a `with` block).

    `plain=None` decides from where the output goes: a bar in a notebook or when `stream` (default
    stderr, as tqdm) is a terminal, plain lines otherwise. `enabled=False` shows nothing.
    A plain line reads `grid: 3/18 fits (17%), 42 s, about 3 min 30 s left; adamw lr 0.003 seed 1`.
    """

    def __init__(self, total: int | None, description: str, *, unit: str = "", enabled: bool = True,
                 leave: bool = True, stream=None, plain: bool | None = None,
                 interval: float = PLAIN_LINE_SECONDS, clock=time.monotonic):
        self.total, self.description, self.unit = total, description, unit
        self.enabled, self.leave, self.interval, self.clock = enabled, leave, interval, clock
        self.stream = stream if stream is not None else sys.stderr
        self.plain = not (in_notebook() or _is_terminal(self.stream)) if plain is None else plain
        self.count, self.postfix, self.lines_written, self.closed = 0, "", 0, False
        self.started = self.last_line = clock()
        self.bar = None
        if not enabled:
            return
        if self.plain:
            if leave:
                self._line("started")
            return
        from tqdm.auto import tqdm

        options = {"file": stream} if stream is not None else {}
        self.bar = tqdm(total=total, desc=description, unit=f" {unit}" if unit else "it", leave=leave,
                        dynamic_ncols=True, **options)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, count: int = 1) -> None:
        self.count += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.enabled and self.plain and self.clock() - self.last_line >= self.interval:
            self._line()

    def set_postfix_str(self, text: str) -> None:
        """What runs now (a grid point, a seed), shown after the counts."""
        self.postfix = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def set_postfix(self, **values) -> None:
        self.set_postfix_str(", ".join(f"{name} {value}" for name, value in values.items()))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.plain and (self.leave or self.lines_written):
            self._line("done")

    def line(self, state: str = "") -> str:
        """The plain line as things stand; `state`: "started", "done" or "" (under way)."""
        seconds = self.clock() - self.started
        unit = f" {self.unit}" if self.unit else ""
        if state == "started":
            size = f"{self.total}{unit}" if self.total is not None else "started"
            return f"{self.description}: {size}" + (", started" if self.total is not None else "")
        counts = f"{self.count}/{self.total}{unit}" if self.total else f"{self.count}{unit}"
        if self.total:
            counts += f" ({100 * self.count / self.total:.0f}%)"
        text = f"{self.description}: {counts}, {_duration(seconds)}"
        if state == "done":
            text += ", done"
        elif self.total and 0 < self.count < self.total:
            text += f", about {_duration(seconds / self.count * (self.total - self.count))} left"
        return text + (f"; {self.postfix}" if self.postfix and state != "done" else "")

    def _line(self, state: str = "") -> None:
        self.stream.write(self.line(state) + "\n")
        self.stream.flush()
        self.lines_written += 1
        self.last_line = self.clock()


def track(iterable, description: str, *, total: int | None = None, **options):
    """Iterate `iterable` under a `Progress` of its length (`total` for one without a len())."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    with Progress(total, description, **options) as progress:
        for item in iterable:
            yield item
            progress.update()
