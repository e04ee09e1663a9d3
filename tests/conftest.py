import contextlib
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import timm
import torch

from course_lib import ledger
from course_lib.config import make_config
from course_lib.models import checkpoint

ROOT = Path(__file__).resolve().parents[1]
FORKSERVER = ROOT / "tests" / "forkserver.py"
SAMPLE_DIR = ROOT / "data_samples" / "landcover-synth"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
# Headless Chromium on a server without a display, a GPU or internet access (root needs --no-sandbox).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _chromium() -> str | None:
    candidates = (os.environ.get("WORKBOOK_CHROMIUM"), shutil.which("chromium"), *CHROMIUM_CANDIDATES)
    return next((path for path in candidates if path and os.path.exists(path)), None)


@pytest.fixture
def chromium():
    """The system Chromium's path (Debian's; Playwright never downloads a browser here), or a skip naming
    what is missing: the browser tests (tests/test_browser.py, tests/test_book.py) need both."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    found = _chromium()
    if found is None:
        pytest.skip("no chromium browser (apt-get install chromium); the browser tests need one")
    return found


@pytest.fixture
def small_disk(tmp_path):
    """A real small filesystem (an 8 MiB tmpfs), where writing past its end fails with the kernel's ENOSPC, as
    a full disk does: the reliability tests of a full disk (issue 49) run on it. Mounting needs root in a
    container that allows it (CI's does); elsewhere a skip says so."""
    import subprocess

    folder = tmp_path / "small_disk"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a real full disk is a tmpfs mount, which needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True,
                          text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


def fill_disk(folder) -> None:
    """Write zeros into `folder`/filler until its filesystem refuses more (ENOSPC)."""
    descriptor = os.open(str(folder / "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(descriptor, bytes(1 << 16))
    except OSError:
        pass
    finally:
        os.close(descriptor)


class TensorImages(torch.utils.data.Dataset):
    """Fixed random images whose mean depends on the label (so they are learnable), in memory."""

    def __init__(self, count, num_classes=4, size=16, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.arange(count) % num_classes
        self.images = torch.randn(count, 3, size, size, generator=generator) + self.targets.view(-1, 1, 1, 1) * 0.5

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], int(self.targets[index])


class CrashAfter(torch.utils.data.Dataset):
    """Raises once `limit` items have been read: a run killed in the middle of an epoch."""

    def __init__(self, dataset, limit):
        self.dataset, self.limit, self.reads = dataset, limit, 0
        self.targets = getattr(dataset, "targets", None)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        self.reads += 1
        if self.reads > self.limit:
            raise KeyboardInterrupt("simulated kill")
        return self.dataset[index]


def tiny_config(tmp_path, **overrides):
    """A CPU config for a tiny model (timm's test_resnet at 16 px) that trains in about a second."""
    values = dict(model="test_resnet", batch_size=16, epochs=1, max_steps=0, lr=0.05, optimizer="sgd",
                  precision="off", device="cpu", num_workers=0, output_dir=str(tmp_path / "checkpoints"),
                  image_size=16)
    values.update(overrides)
    return make_config("smoke", **values)

@pytest.fixture(autouse=True)
def isolated_ledger(tmp_path, monkeypatch):
    """Every test writes to its own ledger, never to the project's runs/ledger.sqlite, and keeps its own
    precision=auto decisions (never the project's data_cache/precision_auto.json)."""
    from course_lib.engine import auto_precision

    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    monkeypatch.delenv(ledger.RUN_ID_ENV, raising=False)
    monkeypatch.setenv(auto_precision.DECISIONS_ENV, str(tmp_path / "precision_auto.json"))
    return path


@pytest.fixture
def eurosat_dir():
    """The real EuroSAT RGB folder (`paths.eurosat_dir`), or a skip with the reason."""
    from course_lib.paths import eurosat_dir

    folder = eurosat_dir()
    if folder is None:
        pytest.skip("no real EuroSAT folder (WORKBOOK_DATA, data_cache/eurosat/, ../shared/datasets/eurosat_rgb) "
                    "on this machine")
    return folder


# --- transfer learning: a source checkpoint and state comparisons (test_factory, test_freeze, test_transfer_plans)

SOURCE_CLASSES = [f"source{i}" for i in range(5)]
TARGET_CLASSES = [f"target{i}" for i in range(3)]


def save_source_checkpoint(tmp_path, classes=SOURCE_CLASSES, model_name="test_resnet"):
    """A checkpoint of a model with `len(classes)` outputs and non-default weights and BN statistics."""
    torch.manual_seed(1)
    model = timm.create_model(model_name, num_classes=len(classes))
    with torch.no_grad():  # as if trained: moved weights, running statistics that are not 0 and 1
        for name, tensor in model.state_dict().items():
            if name.endswith("running_var"):
                tensor.mul_(1 + torch.rand_like(tensor))
            elif tensor.is_floating_point():
                tensor.add_(0.01 * torch.randn_like(tensor))
    config = tiny_config(tmp_path, model=model_name)
    path = checkpoint.save_checkpoint({"model": model.state_dict(), "config": config.to_dict(),
                                       "classes": list(classes), "epoch": 1}, tmp_path / "source.pt")
    return path, {k: v.clone() for k, v in model.state_dict().items()}


def split_state(model):
    """(backbone state incl. BatchNorm statistics, head state), cloned."""
    head_names = {name for name, _ in model.get_classifier().named_parameters()}
    prefix = next(n for n, m in model.named_modules() if m is model.get_classifier())
    head_keys = {f"{prefix}.{name}" for name in head_names}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return ({k: v for k, v in state.items() if k not in head_keys}, {k: v for k, v in state.items() if k in head_keys})


def assert_equal_states(first, second):
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


# --- where the time of a test run goes (issue 46): per file and per kind, printed after every run --------------
SLOW_KINDS = ("notebook", "browser", "torchrun", "slow")  # the markers of pyproject.toml; anything else is "unit"
_seconds_by_file: dict[str, float] = {}
_seconds_by_kind: dict[str, float] = {}
_tests_by_kind: dict[str, int] = {}
_budget_lines: list[str] = []
_by_process: dict[str, tuple[float, float]] = {}  # process: (seconds of its tests, when its last report came)
_started = time.monotonic()


def kind_of_test(keywords) -> str:
    """The slow kind a test belongs to (its first marker of `SLOW_KINDS`), else "unit". `keywords`: a test item's
    or its report's keywords (a report under pytest-xdist reaches the controlling process without the item)."""
    return next((kind for kind in SLOW_KINDS if kind in keywords), "unit")


FORK_FOLDER_ENV = "WORKBOOK_TEST_FORK_FOLDER"  # `pytest_configure`: the folder of the session's one fork server


@pytest.fixture(scope="session", autouse=True)
def fork_server(request):
    """One fork server per session (tests/forkserver.py), started by the first test process that runs a test of a
    slow kind; the other pytest-xdist processes of the session use it too (each started its own before: three
    servers importing torch, timm and ipykernel, about 7 s of CPU each), and the controlling process stops it at the
    end (`pytest_unconfigure`). The `python3` kernel of this process, and of the processes it starts (`workbook
    run`), becomes `forkserver.py run` (a kernelspec first on JUPYTER_PATH), the README's commands go through it
    (`forkserver.forked_argv`), and so do torchrun's workers (PYTHON_EXEC, the interpreter torch.distributed.run
    starts them with). Its imports are not awaited here, only its socket (it listens first): a kernel or command that
    asks while they run waits for its fork. Its socket's path, or None (WORKBOOK_FORK_SERVER=off, a unit-only run,
    or a `python3` kernel of another interpreter)."""
    import fcntl

    import forkserver
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    other_interpreter = Path(spec.argv[0]).resolve() != Path(sys.executable).resolve()
    if os.environ.get(forkserver.SOCKET_ENV) == "off" or other_interpreter or not os.environ.get(FORK_FOLDER_ENV) \
            or all(kind_of_test(item.keywords) == "unit" for item in request.session.items):
        yield None
        return
    folder = Path(os.environ[FORK_FOLDER_ENV])
    with open(folder / "lock", "w") as lock:  # the first process to come starts it; the others find it started
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "server.pid").exists():
            (folder / "kernels" / "python3").mkdir(parents=True)
            kernel = {**spec.to_dict(), "argv": [sys.executable, str(FORKSERVER), "run", *spec.argv[1:]]}
            (folder / "kernels" / "python3" / "kernel.json").write_text(json.dumps(kernel))
            forkserver.interpreter(str(folder))
            options = [argument for argument in spec.argv[1:] if argument.startswith("-X")]  # the kernel's options
            with open(folder / "server.log", "wb") as log:
                server = subprocess.Popen([sys.executable, *options, str(FORKSERVER), "serve", str(folder / "server")],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            (folder / "server.pid").write_text(str(server.pid))
    pid, deadline = int((folder / "server.pid").read_text()), time.monotonic() + 30
    while not (folder / "server").exists() and _alive(pid) and time.monotonic() < deadline:  # a dead server: no wait
        time.sleep(0.02)
    saved = {name: os.environ.get(name) for name in (forkserver.SOCKET_ENV, "JUPYTER_PATH", "PYTHON_EXEC")}
    os.environ[forkserver.SOCKET_ENV] = str(folder / "server")
    os.environ["PYTHON_EXEC"] = str(folder / "python")  # torchrun's workers (tests/forkserver.py)
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(folder), saved["JUPYTER_PATH"]]))
    yield folder / "server"
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _stop_fork_server(folder: Path) -> None:
    """The end of the session: stop its fork server, if a test process started one, and remove its folder."""
    if (folder / "server.pid").exists():
        pid = int((folder / "server.pid").read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):  # a pytest-xdist process started it: not this one's child
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # Linux: a zombie no process has reaped yet has ended too
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")


@pytest.fixture(scope="session")
def notebooks_home(tmp_path_factory) -> Path:
    """The notebooks/ folder the chapter, solution and rehearsal tests execute from. In one process, the checkout's.
    In a pytest-xdist process (`make test`: --dist loadfile, so tests/test_notebooks.py and tests/test_solutions.py
    may run at once in two), a copy inside a project of that process's own: every other top-level entry of the
    checkout linked, its own runs/ and data_cache/. A kernel finds its project from its working folder (the
    notebook's, `paths.project_root`), so a chapter and its solution running at once never share a checkpoint
    folder's run lock, a cache being built or a cached model."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return ROOT / "notebooks"
    project = tmp_path_factory.mktemp("checkout")
    for entry in ROOT.iterdir():
        if entry.name not in {"notebooks", "runs", "data_cache", ".git"}:
            (project / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "notebooks", project / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return project / "notebooks"


def _controlling(config) -> bool:
    """Whether this process runs the session (not a pytest-xdist worker)."""
    return not hasattr(config, "workerinput")


@pytest.fixture(autouse=True)
def collect_what_kernels_left(request):
    """After a test of a slow kind (it started kernels or processes), collect garbage now. nbclient leaves asyncio
    tasks behind, whose finalizer logs "Task exception was never retrieved" with a traceback; Python 3.11 formats
    a traceback with `ast.parse`. Collected later, inside another test's `ast.parse`, that nested parse broke the
    outer one ("SystemError: AST constructor recursion depth mismatch", tests/test_layout.py in a pytest-xdist
    process that had run notebooks before it)."""
    yield
    if kind_of_test(request.node.keywords) != "unit":
        gc.collect()


def pytest_configure(config):
    """In a pytest-xdist worker, torch and the processes it starts (kernels, `workbook` commands, torchrun) get
    one thread each: two workers with torch's default of one thread per core would each spin on every core, and
    the same suite took four times as long. The controlling process names the folder of the session's fork server
    (`fork_server`) in the environment its workers inherit; a test's own pytest gets a folder of its own."""
    if not _controlling(config):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    else:  # short: a Unix socket's path holds at most 107 bytes
        config.fork_folder = Path(tempfile.mkdtemp(prefix="workbook-fork-"))
        os.environ[FORK_FOLDER_ENV] = str(config.fork_folder)


def pytest_unconfigure(config):
    if _controlling(config) and hasattr(config, "fork_folder"):
        _stop_fork_server(config.fork_folder)


def pytest_collection_modifyitems(items):
    # Every CUDA-only test carries the one `cuda` mark (its reason as the mark's `reason=`): without a GPU
    # it is skipped with that reason, and a GPU machine runs exactly these with `pytest -m cuda`.
    if not torch.cuda.is_available():
        for item in items:
            if (mark := item.get_closest_marker("cuda")) is not None:
                item.add_marker(pytest.mark.skip(reason=mark.kwargs.get("reason", "needs a CUDA GPU")))
    import time_budget

    # Heaviest files first (`time_budget.heaviest_files_first`): `make test` hands them out in this order.
    files = {}  # each file's tests, in order: only whole files move
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = time_budget.heaviest_files_first([(name, [kind_of_test(item.keywords) for item in tests])
                                              for name, tests in files.items()], time_budget.load())
    items[:] = [item for name in order for item in files[name]]


def pytest_runtest_logreport(report):
    """Setup, call and teardown all count: a fixture that executes a notebook is part of the test's time."""
    kind, name = kind_of_test(report.keywords), report.nodeid.split("::")[0]
    process = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "this process")  # xdist's gw0...
    seconds, _ = _by_process.get(process, (0.0, 0.0))
    _by_process[process] = (seconds + report.duration, time.monotonic() - _started)
    _seconds_by_file[name] = _seconds_by_file.get(name, 0.0) + report.duration
    _seconds_by_kind[kind] = _seconds_by_kind.get(kind, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _tests_by_kind[kind] = _tests_by_kind.get(kind, 0) + 1


def time_table(by_kind: dict, tests: dict, by_file: dict, files: int = 12, by_process: dict | None = None) -> list[str]:
    """The summary's lines: seconds and tests per kind, the `files` slowest test files, then per pytest-xdist
    process its tests' seconds and when it reported last (two processes ending far apart: one idled)."""
    total = sum(by_kind.values()) or 1.0
    lines = ["seconds per kind of test (setup, call and teardown):"]
    lines += [f"  {kind:<9} {seconds:8.1f} s  {100 * seconds / total:5.1f}%  {tests.get(kind, 0):5d} test(s)"
              for kind, seconds in sorted(by_kind.items(), key=lambda item: -item[1])]
    lines.append(f"the {min(files, len(by_file))} slowest test files:")
    lines += [f"  {seconds:8.1f} s  {name}" for name, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:files]]
    if by_process and len(by_process) > 1:
        lines.append("per process: " + "; ".join(f"{name} {seconds:.1f} s of tests, its last at {last:.0f} s"
                                                  for name, (seconds, last) in sorted(by_process.items())))
    return lines


def pytest_sessionfinish(session):
    """The time budget per kind (tests/time_budget.py): a kind past it fails the run, unless WORKBOOK_TEST_BUDGET=off.
    The machine is calibrated here, after the tests, and only when a kind can be checked: a run of a few tests does not
    pay for it."""
    if not _controlling(session.config) or session.config.option.collectonly or not _seconds_by_kind:
        return
    import time_budget

    workers = getattr(session.config.option, "numprocesses", None) or 1
    budget = time_budget.load()
    here = time_budget.calibrate() if time_budget.checkable(_tests_by_kind, budget, workers) else None
    lines, failed = time_budget.check(_seconds_by_kind, _tests_by_kind, budget, here, workers)
    _budget_lines[:] = lines
    if failed and time_budget.enforced() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        _budget_lines.append(f"a kind of test went past its time budget: the run fails ({time_budget.OFF_ENV}=off "
                             "only prints; after a deliberate change, measure again and update tests/time_budget.json)")


def pytest_terminal_summary(terminalreporter):
    for line in [*(time_table(_seconds_by_kind, _tests_by_kind, _seconds_by_file, by_process=_by_process)
                   if _seconds_by_kind else []),
                 *_budget_lines]:
        terminalreporter.write_line(line)
