"""Progress of the calls that take more than a few seconds (a grid of fits, an ablation, a seed loop,
an epoch, a download): a tqdm bar (https://tqdm.github.io) in a notebook (a widget, `tqdm.auto`) or
on a terminal, and plain lines, without carriage returns, when the output is a pipe or a file (a CI
log, `workbook train | tee train.log`): one every `interval` seconds, plus a start and an end line
for an outer loop (`leave=True`).

In a notebook the widget is shown under a display id, and closing the bar replaces it with its plain
final line (empty for `leave=False`): the saved notebook holds text, not a widget whose state it lacks,
so a reopened notebook shows no "Error displaying widget: model not found". A cell's inner bars share one
output, so its epochs do not pile up one output each.
"""
from __future__ import annotations

import sys
import time

PLAIN_LINE_SECONDS = 10.0  # at most one plain line per bar this often
_TRANSIENT: dict = {}  # the output the current cell's inner (leave=False) bars take turns in: {"count", "handle"}


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
    """One long call's progress, with tqdm's verbs: `update(n)`, `set_postfix(loss=...)`, `set_postfix_str(...)`,
    `close()` (or a `with` block). `plain=None`: a bar in a notebook or when `stream` (default stderr) is a terminal,
    plain lines otherwise, e.g. `grid: 3/18 fits (17%), 42 s, about 3 min 30 s left; adamw lr 0.003 seed 1`.
    `in_bytes`: counts are bytes, shown in MiB (`initial`: bytes already there, a resumed download); `delay`: no bar
    (and no start line) for a call that ends within that many seconds, tqdm's `delay`."""

    def __init__(self, total: int | None, description: str, *, unit: str = "", enabled: bool = True,
                 leave: bool = True, stream=None, plain: bool | None = None, in_bytes: bool = False,
                 initial: int = 0, interval: float | None = None, delay: float = 0.0, clock=time.monotonic):
        self.total, self.description, self.in_bytes = total, description, in_bytes
        self.unit = "MiB" if in_bytes else unit
        self.enabled, self.leave, self.clock = enabled, leave, clock
        self.interval = PLAIN_LINE_SECONDS if interval is None else interval
        self.stream = stream if stream is not None else sys.stderr
        self.plain = not (in_notebook() or _is_terminal(self.stream)) if plain is None else plain
        self.initial = self.count = initial
        self.postfix, self.lines_written, self.closed = "", 0, False
        self.started = self.last_line = clock()
        self.bar = self.handle = None
        self.delay = delay
        if not enabled:
            return
        if self.plain:
            if leave and not delay:
                self._line("started")
            return
        widget = in_notebook() and stream is None
        if widget:
            from tqdm.notebook import tqdm
        else:
            from tqdm.auto import tqdm
        options = (dict(unit="B", unit_scale=True, unit_divisor=1024) if in_bytes
                   else dict(unit=f" {unit}" if unit else "it"))
        options.update({"file": stream} if stream is not None else {})
        # A widget is shown by `_show` under a display id, so that `close` can put text in its place.
        options.update(dict(display=False, delay=0) if widget else dict(delay=delay))
        self.bar = tqdm(total=total, desc=description, initial=initial, leave=leave, dynamic_ncols=True, **options)
        if widget and not delay:
            self._show()

    def _show(self) -> None:
        from IPython import get_ipython
        from IPython.display import display

        if self.leave:
            self.handle = display(self.bar.container, display_id=True)
            return
        # Inner bars (an epoch's, a prediction's) of one cell take turns in one output: a cell of 20 fits x 60
        # epochs leaves one line, not 1,200 outputs.
        count = getattr(get_ipython(), "execution_count", None)
        if _TRANSIENT.get("count") == count and _TRANSIENT.get("handle") is not None:
            self.handle = _TRANSIENT["handle"]
            self.handle.update(self.bar.container)
        else:
            self.handle = display(self.bar.container, display_id=True)
            _TRANSIENT.update(count=count, handle=self.handle)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, count: int = 1) -> None:
        self.count += count
        if self.bar is not None:
            self.bar.update(count)
            if self.handle is None and self.delay and hasattr(self.bar, "container") \
                    and self.clock() - self.started >= self.delay:  # a widget shown once the delay has passed
                self._show()
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
            if self.handle is not None:  # the widget gives way to text a saved notebook can show
                self.handle.update({"text/plain": self.line("done") if self.leave else ""}, raw=True)
                self.bar.container.close()
        elif self.enabled and self.plain and (self.leave or self.lines_written):
            self._line("done")

    def line(self, state: str = "") -> str:
        """The plain line as things stand; `state`: "started", "done" or "" (under way)."""
        seconds = self.clock() - self.started
        unit = f" {self.unit}" if self.unit else ""
        shown = (lambda count: f"{count / 2**20:.1f}") if self.in_bytes else str  # bytes shown in MiB
        if state == "started":
            return f"{self.description}: " + (f"{shown(self.total)}{unit}, started" if self.total is not None
                                              else "started")
        counts = f"{shown(self.count)}/{shown(self.total)}{unit}" if self.total else f"{shown(self.count)}{unit}"
        if self.total:
            counts += f" ({100 * self.count / self.total:.0f}%)"
        text = f"{self.description}: {counts}, {_duration(seconds)}"
        if state == "done":
            text += ", done"
        elif self.total and self.initial < self.count < self.total:  # the rate of this run, a resumed part aside
            rate = (self.count - self.initial) / seconds if seconds > 0 else 0
            text += f", about {_duration((self.total - self.count) / rate)} left" if rate > 0 else ""
        return text + (f"; {self.postfix}" if self.postfix and state != "done" else "")

    def _line(self, state: str = "") -> None:
        self.stream.write(self.line(state) + "\n")
        self.stream.flush()
        self.lines_written += 1
        self.last_line = self.clock()


def track(iterable, description: str, *, total: int | None = None, **options):
    """Iterate `iterable` under a `Progress` of its length (`total` for one without a len())."""
    if total is None:
        try:
            total = len(iterable)
        except TypeError:  # no len(): a generator, a DataLoader over a stream
            pass
    with Progress(total, description, **options) as progress:
        for item in iterable:
            yield item
            progress.update()
