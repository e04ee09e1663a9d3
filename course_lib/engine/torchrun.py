"""Launch `workbook train` (or `ddp-probe`) under torchrun from a notebook cell or a shell, stream every rank's lines as
they arrive, and, when a launch fails, name the rank whose own error came first.

`launch(2, {"model": "resnet18"})` runs `python -m torch.distributed.run --nproc-per-node 2
-m course_lib train ...` as a *subprocess*: starting DDP workers from a notebook kernel through
fork/spawn is a well-known source of hangs (CUDA cannot be re-initialised in a forked child,
spawn must re-import `__main__`, which a kernel does not have, and a crashed worker can leave the
kernel blocked in a collective). torchrun: https://pytorch.org/docs/stable/elastic/run.html.

The failure report names the rank whose *own* error came first (a one-line workbook error, a traceback that is not a
lost connection, a crash by signal), not the peers that failed because it went away, whatever torchrun's "Root Cause"
says. A launch that runs past its timeout (by default sized from the run: `fitting_timeout`) is stopped with every
process it started, workers in their own sessions and their DataLoader workers included. The measurements made through
it are in `engine.ddp`.
"""
from __future__ import annotations

import dataclasses
import os
import queue
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from course_lib import ledger, paths
from course_lib.config import Config, ConfigError, WorkbookError


# torchrun prefixes each worker line with this (global rank, so unique across nodes).
RANK_PREFIX_TEMPLATE = "[rank${rank}] "
_RANK_LINE = re.compile(r"^\[rank(\d+)\] ?(.*)$")
# torch also prefixes a distributed worker's stderr with "[rankN]: "; drop the duplicate.
_INNER_RANK = re.compile(r"^\[rank\d+\]: ?")
# The profiler's C++ library (kineto) prints these on every start/stop; they carry no information here.
_PROFILER_CHATTER = re.compile(r"^(USDT|STAGE|ERROR|WARNING|INFO):\d{4}-\d\d-\d\d [\d:.]+ \d+:\d+ \w+\.cpp:\d+\]")
# torchrun's failure summary: "rank      : 1 (local_rank: 1)" then "exitcode  : 1 (pid: 123)".
_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
# A rank's own failure starts with the CLI's one-line error or a traceback.
_HANDLED_ERROR = re.compile(r"^workbook [\w-]+: error: ")
_ERROR_START = re.compile(r"^(?:Traceback \(most recent call last\)|workbook [\w-]+: error: )")
# What a rank prints when a *peer* went away (it exited, crashed or closed the process group).
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
                        r"NCCL communicator was aborted|ncclRemoteError|DistNetworkError|Socket Timeout|"
                        r"failed to recv, got 0 bytes", re.IGNORECASE)
# Signals that mean "stopped by torchrun or by us" rather than "crashed".
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_GRACE_SECONDS = 10  # from SIGTERM to SIGKILL when a launch is stopped
# Default timeouts (fitting_timeout): deliberately slow bounds, so only a hung run reaches them.
STARTUP_SECONDS = 600  # imports, rendezvous, building or caching the dataset on a busy machine
SECONDS_PER_MEGAPIXEL = {"cpu": 10.0, "cuda": 0.5}  # training one megapixel of images: a large model, slow machine
VALIDATION_SHARE = 0.25  # validation adds up to a quarter to each epoch
PROBE_SECONDS = 900  # `ddp-probe`: a few timed steps per setting
KNOWN_TRAIN_IMAGES = {"cifar10": 50_000, "eurosat": 27_000, "digits": 1_797}
UNKNOWN_TRAIN_IMAGES = 50_000  # when the dataset cannot be counted


class LaunchError(WorkbookError):
    """A torchrun launch failed or timed out; the message names the rank and its last lines."""


@dataclasses.dataclass
class RankFailure:
    rank: int | None  # global rank; None when torchrun failed before any worker ran
    local_rank: int | None
    exitcode: int | None  # negative: killed by that signal (often torchrun stopping the others)
    last_lines: list[str]
    root_cause: bool = False  # this rank's own error came first
    cause: str = "own"  # own | peer (it failed because another rank went away) | stopped (by a signal)

    def describe(self) -> str:
        who = f"rank {self.rank} (local rank {self.local_rank})" if self.rank is not None else "torchrun itself"
        code = f"exit code {self.exitcode}" if self.exitcode is not None else "no exit code"
        if self.exitcode is not None and self.exitcode < 0:
            try:
                code += f" ({signal.Signals(-self.exitcode).name})"
            except ValueError:
                pass
        if self.cause == "own" and self.exitcode == -signal.SIGKILL:
            # No one else sends a worker SIGKILL unasked: the kernel's out-of-memory killer does.
            code += ", probably out of memory (the kernel's OOM killer: see `dmesg`; lower batch_size or image_size)"
        if self.cause == "own" and self.exitcode is not None and -self.exitcode in _STOP_SIGNALS:
            code += ", stopped while it was exiting"
        tail = "\n".join(f"    {line}" for line in self.last_lines) or "    (no output)"
        if self.cause == "peer":
            return f"{who} then failed with {code} because another rank went away; its last lines:\n{tail}"
        if self.cause == "stopped":
            return f"{who} was stopped with {code}; its last lines:\n{tail}"
        first = " first" if self.root_cause else ""
        return f"{who} failed{first} with {code}; its last lines:\n{tail}"


@dataclasses.dataclass
class LaunchResult:
    run_id: str  # WORKBOOK_RUN_ID the workers wrote their ledger rows with
    commands: list[list[str]]  # one torchrun command per (simulated) node
    returncode: int
    world_size: int
    nnodes: int
    duration_seconds: float
    lines: list[str]  # everything torchrun printed, in order
    rank_lines: dict[int, list[str]]  # each rank's own lines, prefix removed
    rows: list[dict]  # the ledger rows the workers recorded (rank 0 records), newest first
    failures: list[RankFailure]
    log_dir: Path  # torchrun's per-rank stdout/stderr files
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def metrics(self) -> dict:
        """The metrics of the newest ledger row (empty when the workers recorded nothing)."""
        return self.rows[0]["metrics"] if self.rows else {}

    @property
    def parameters(self) -> dict:
        """The parameters of the newest ledger row: what the workers ran with (precision_used ...)."""
        return self.rows[0].get("parameters", {}) if self.rows else {}

    def failure_report(self) -> str:
        if self.ok:
            return f"all {self.world_size} ranks finished"
        command = self.commands[0] if self.commands else []
        endpoint = command[command.index("--rdzv-endpoint") + 1] if "--rdzv-endpoint" in command else "?"
        head = (f"torchrun timed out after {self.duration_seconds:.0f} s (rendezvous on {endpoint})"
                if self.timed_out else f"torchrun exited with code {self.returncode}")
        body = "\n".join(failure.describe() for failure in self.failures)
        return f"{head}; per-rank logs in {self.log_dir}\n{body}"

    def raise_for_failure(self) -> LaunchResult:
        if not self.ok:
            raise LaunchError(self.failure_report())
        return self


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the OS picks it) for the rendezvous endpoint."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def rendezvous_port(host: str = "127.0.0.1", port: int = 0) -> int:
    """The rendezvous port: `port` (0: one the OS picks as free), checked free on `host` now, so a
    taken port is one line (LaunchError naming it) instead of a silent wait for the whole timeout:
    torchrun's c10d agent cannot serve its store there, and it says nothing while it retries."""
    chosen = port or free_port(host)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is still usable
        try:
            probe.bind((host, chosen))
        except OSError as error:
            raise LaunchError(f"the rendezvous port {host}:{chosen} is in use ({error.strerror or error}); "
                              "pass another --port, or --port 0 for a free one") from None
    return chosen


def new_run_id() -> str:
    """A fresh id for one launch's ledger rows; it extends the enclosing workbook run's id, if any."""
    parent = os.environ.get(ledger.RUN_ID_ENV)
    return f"{parent + '/' if parent else ''}ddp-{time.strftime('%H%M%S')}-{secrets.token_hex(3)}"


def torchrun_command(command_name: str, command_args: list[str], nproc_per_node: int, *, nnodes: int = 1,
                     rdzv_endpoint: str, rdzv_id: str, log_dir: Path,
                     local_addr: str | None = "127.0.0.1") -> list[str]:
    """`python -m torch.distributed.run ...` with c10d rendezvous, every rank's output tee'd to
    the console with a "[rankN] " prefix and to log_dir/<rdzv_id>_*/attempt_0/<local_rank>/."""
    command = [sys.executable, "-m", "torch.distributed.run",
               "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id,
               "--max-restarts", "0", "--tee", "3", "--log-dir", str(log_dir),
               "--log-line-prefix-template", RANK_PREFIX_TEMPLATE]
    # No --node-rank: with c10d rendezvous the nodes get their ranks in order of arrival (torchrun
    # warns that --node-rank is ignored); the static backend (--master-addr/--master-port) needs it.
    if local_addr:
        command += ["--local-addr", local_addr]  # the address other nodes use to reach this one
    return command + ["-m", "course_lib", command_name, *command_args]


# Where each torchrun value of the loopback launch comes from on a cluster, per recipe in docs/
# (slurm_example.sh, skypilot.yaml, kubeflow_trainjob.yaml); tests/test_launch_recipes.py checks that
# each recipe file holds its entry. The entry point after the flags is the same everywhere.
CLUSTER_RECIPES = ("docs/slurm_example.sh", "docs/skypilot.yaml", "docs/kubeflow_trainjob.yaml")
CLUSTER_EQUIVALENTS = {
    "--nnodes": ("$SLURM_NNODES", "$SKYPILOT_NUM_NODES", "PET_NNODES (from numNodes)"),
    "--nproc-per-node": ("$GPUS_PER_NODE", "$SKYPILOT_NUM_GPUS_PER_NODE", "PET_NPROC_PER_NODE (from nvidia.com/gpu)"),
    "--rdzv-endpoint": ("${HEAD_NODE}:${RDZV_PORT}", "${HEAD_IP}:${RDZV_PORT}", "PET_MASTER_ADDR:PET_MASTER_PORT"),
    "--rdzv-id": ("$SLURM_JOB_ID", "$SKYPILOT_TASK_ID", "the TrainJob's name"),
    "--local-addr": ("(the node's own hostname)", "(the node's own IP)", "(the pod's IP)"),
}


def cluster_mapping(command: list[str]):
    """A table: each torchrun flag of a loopback `command` (from `launch`), its value here, and
    where SLURM, SkyPilot and Kubeflow Trainer take it from in the recipes of docs/."""
    import pandas as pd

    rows = []
    for flag, (slurm, skypilot, kubeflow) in CLUSTER_EQUIVALENTS.items():
        here = command[command.index(flag) + 1] if flag in command else "-"
        rows.append({"torchrun flag": flag, "loopback (this machine)": here, "SLURM": slurm, "SkyPilot": skypilot,
                     "Kubeflow TrainJob": kubeflow})
    entry = command[command.index("course_lib") - 1:command.index("course_lib") + 2]
    rows.append({"torchrun flag": "entry point", "loopback (this machine)": " ".join(entry),
                 **{name: " ".join(entry) for name in ("SLURM", "SkyPilot", "Kubeflow TrainJob")}})
    return pd.DataFrame(rows).set_index("torchrun flag")


def worker_environment(run_id: str, threads_per_process: int | None = 1, extra: dict | None = None) -> dict:
    """The workers' environment: the parent's ledger and a fresh run id, the project on the path,
    loopback networking, and OMP/MKL threads per process."""
    root = paths.project_root()
    env = dict(os.environ)
    env[ledger.RUN_ID_ENV] = run_id
    env[ledger.LEDGER_ENV] = str(ledger.default_path().resolve())
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed, not when a buffer fills
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    if "lo" in {name for _, name in socket.if_nameindex()}:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo binds loopback, never an outside interface
    if threads_per_process:
        # Each process also runs intra-op threads; N processes x default threads oversubscribe the cores.
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads_per_process)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def default_workers(config) -> int:
    """Every visible GPU when the config trains on CUDA, else 2 CPU processes."""
    import torch

    if config.device != "cpu" and torch.cuda.is_available():
        return max(1, torch.cuda.device_count())
    return 2


# Always passed on: a worker given no data would choose its own (`paths.choose_data`).
DATA_FIELDS = ("dataset", "data_dir")


def config_overrides(config, profile: str | None) -> dict:
    """The fields where `config` differs from `profile`, and its data: what the workers need as -p flags."""
    from course_lib.config import make_config

    base = make_config(profile).to_dict()
    return {name: value for name, value in config.to_dict().items()
            if base.get(name) != value or (name in DATA_FIELDS and value)}


def resolve_params(params, profile: str | None):
    """(Config the workers will build, the -p overrides that build it) from a dict or a Config; a
    dict without data gets the data `datasets.config_with_data` picks, passed on explicitly."""
    from course_lib.data.datasets import config_with_data

    if isinstance(params, Config):
        return params, config_overrides(params, profile)
    config, _ = config_with_data(profile, **(params or {}))
    params = {k: v for k, v in (params or {}).items() if v is not None}
    return config, {**{name: getattr(config, name) for name in DATA_FIELDS if getattr(config, name)}, **params}


def command_args(command: str, params, profile: str | None, args: list[str]) -> list[str]:
    if isinstance(params, Config):
        params = config_overrides(params, profile)
    out = ["--profile", profile] if profile else []
    for name, value in (params or {}).items():
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += ["-p", f"{name}={text}"]
    if command == "train" and "--no-progress" not in args:
        out.append("--no-progress")  # progress bars redraw with \r: unreadable once piped
    return out + list(args)


def _count_images(folder: Path) -> int:
    return sum(1 for _, _, files in os.walk(folder) for name in files
               if os.path.splitext(name)[1].lower() in (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"))


def train_images_estimate(config, world_size: int = 1) -> int:
    """About how many images one epoch of `config` trains on (all ranks together): max_train_images,
    else the dataset's size (counted for a folder), capped by max_steps."""
    images = config.max_train_images
    if not images:
        images = KNOWN_TRAIN_IMAGES.get(config.dataset, 0)
    if not images and config.data_dir:
        folder = paths.resolve_path(config.data_dir)
        images = _count_images(folder / "train" if (folder / "train").is_dir() else folder)
    images = images or UNKNOWN_TRAIN_IMAGES
    if config.max_steps:
        images = min(images, config.max_steps * config.batch_size * config.accumulation_steps * world_size)
    return images


def fitting_timeout(config, command: str = "train", world_size: int = 1) -> float:
    """Seconds a launch may run before it counts as hung: STARTUP_SECONDS plus, for training,
    epochs x (images x image_size^2) at a deliberately slow SECONDS_PER_MEGAPIXEL, plus
    validation; PROBE_SECONDS for the DDP probes. Pass `timeout=` to launch to choose another."""
    if command != "train":
        return float(PROBE_SECONDS)
    import torch

    kind = "cpu" if config.device == "cpu" or not torch.cuda.is_available() else "cuda"
    megapixels = train_images_estimate(config, world_size) * config.image_size ** 2 / 1e6
    per_epoch = megapixels * SECONDS_PER_MEGAPIXEL[kind] * (1 + VALIDATION_SHARE)
    return float(round(STARTUP_SECONDS + config.epochs * per_epoch))


def launch(nproc: int, params: dict | Config | None = None, profile: str | None = "auto", *,
           command: str = "train", args: list[str] | tuple = (), nnodes: int = 1,
           threads_per_process: int | None = 1, env: dict | None = None, timeout: float | None = None,
           echo=print, check: bool = True, last_lines: int = 15, log_dir: str | os.PathLike | None = None,
           host: str = "127.0.0.1", port: int = 0) -> LaunchResult:
    """Run `workbook <command>` (train, or ddp-probe) under torchrun with `nproc` processes per node
    (and `nnodes` torchrun processes on this machine standing in for nodes, joined by c10d rendezvous
    on `host`), streaming every line to `echo` as it arrives. `params` are Config fields (a dict, or a
    Config whose differences from `profile` are passed on). Returns the ledger rows the run recorded;
    when a rank fails, raises LaunchError naming the rank whose own error came first, with its last
    lines (check=False returns the result instead). `timeout` in seconds; None: `fitting_timeout`
    for this run. On timeout or Ctrl-C every process the launch started is stopped. `port`: the
    rendezvous port on `host` (0: a free one); a taken port is a LaunchError before anything starts."""
    if nproc < 1 or nnodes < 1:
        raise ConfigError(f"nproc and nnodes must be at least 1, got nproc={nproc}, nnodes={nnodes}")
    if host not in ("127.0.0.1", "localhost"):
        raise ConfigError(f"launch() starts every node on this machine, so host must be 127.0.0.1, got {host!r}; "
                          "for real clusters see docs/slurm_example.sh")
    config, params = resolve_params(params, profile)  # a bad value stops here, once, instead of in every worker
    timeout = fitting_timeout(config, command, nproc * nnodes) if timeout is None else timeout
    rdzv_endpoint = f"{host}:{rendezvous_port(host, port)}"  # a taken port: one line, nothing started
    root, run_id = paths.project_root(), new_run_id()
    log_dir = Path(log_dir) if log_dir else root / "runs" / "ddp_logs" / run_id.replace("/", "_")
    log_dir.mkdir(parents=True, exist_ok=True)
    worker_args = command_args(command, params, profile, list(args))
    # Every "node" runs the same command: c10d hands out node ranks in order of arrival.
    commands = [torchrun_command(command, worker_args, nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
                                 rdzv_id=run_id.replace("/", "_"), log_dir=log_dir, local_addr=host)
                for _ in range(nnodes)]
    environment = worker_environment(run_id, threads_per_process, env)
    if echo:
        nodes = f"   (x{nnodes} nodes on {host})" if nnodes > 1 else ""
        echo(f"$ {shlex.join(['python', *commands[0][1:]])}{nodes}   (timeout {timeout:.0f} s)")

    logs, processes = RankLogStream(nnodes, echo), []
    started = time.perf_counter()
    try:
        for node, node_command in enumerate(commands):
            # A new session per torchrun, so stopping it never signals this process's own group.
            processes.append(subprocess.Popen(node_command, cwd=root, env=environment, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True, bufsize=1,
                                              start_new_session=True, errors="replace"))
            logs.follow(processes[-1].stdout, node)
        timed_out = not logs.wait(deadline=started + timeout)
        _wait_or_stop(processes, at_once=timed_out)
    except BaseException:  # Ctrl-C in the notebook or shell: leave nothing running
        _stop(processes)
        raise
    returncode = 124 if timed_out else next((process.returncode for process in processes if process.returncode), 0)
    rows = ledger.Ledger(environment[ledger.LEDGER_ENV]).rows(run_id=run_id)
    result = LaunchResult(run_id=run_id, commands=commands, returncode=returncode, world_size=nproc * nnodes,
                          nnodes=nnodes, duration_seconds=time.perf_counter() - started, lines=logs.lines,
                          rank_lines=logs.rank_lines, rows=rows, log_dir=log_dir, timed_out=timed_out,
                          failures=[] if returncode == 0 else logs.failures(log_dir, last_lines, timed_out))
    return result.raise_for_failure() if check else result


class RankLogStream:
    """The lines of one launch's torchrun processes as they arrive: all in order, per node, and per
    rank with torchrun's "[rankN] " prefix removed, with when each rank's first error line came (the
    failure report orders the ranks by it). Each line is shown to `echo` at once, profiler chatter
    left out."""

    def __init__(self, nnodes: int, echo=None):
        self.nnodes, self.echo = nnodes, echo
        self.lines: list[str] = []
        self.node_lines: list[list[str]] = [[] for _ in range(nnodes)]
        self.rank_lines: dict[int, list[str]] = {}
        self.first_error_at: dict[int, float] = {}  # time.perf_counter() seconds
        self._arrived: queue.Queue = queue.Queue()
        self._open = 0  # streams not yet closed

    def follow(self, stream, node: int) -> None:
        """Read `stream` (one torchrun's stdout) on a thread of its own until it closes."""
        self._open += 1
        threading.Thread(target=self._pump, args=(stream, node), daemon=True).start()

    def _pump(self, stream, node: int) -> None:
        for line in stream:
            self._arrived.put((node, line.rstrip("\n")))
        self._arrived.put((node, None))

    def wait(self, deadline: float) -> bool:
        """Take lines until every stream has closed (True) or time.perf_counter() passes `deadline`
        (False), whether or not lines keep arriving."""
        while self._open:
            if time.perf_counter() > deadline:
                return False
            try:
                node, line = self._arrived.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                self._open -= 1
            else:
                self.add(node, line)
        return True

    def add(self, node: int, line: str) -> None:
        self.lines.append(line)
        self.node_lines[node].append(line)
        match = _RANK_LINE.match(line)
        if match:
            rank, content = int(match.group(1)), _INNER_RANK.sub("", match.group(2))
            self.rank_lines.setdefault(rank, []).append(content)
            if _ERROR_START.match(content):
                self.first_error_at.setdefault(rank, time.perf_counter())
            if _PROFILER_CHATTER.match(content):
                return
        if self.echo:
            shown = f"[rank{rank}] {content}" if match else line
            self.echo(f"[node{node}] {shown}" if self.nnodes > 1 and not match else shown)

    def failures(self, log_dir: Path, last_lines: int, timed_out: bool) -> list[RankFailure]:
        return _failures(self.node_lines, self.rank_lines, log_dir, last_lines, timed_out, self.first_error_at)


def _wait_or_stop(processes, at_once: bool = False) -> None:
    """Give each torchrun 30 s to exit after its output closed (none when `at_once`), then stop it."""
    if at_once:
        _stop(processes)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _stop([process])


def _running(process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_all(groups: set[int], victims, signum) -> None:
    for group in groups:
        try:
            os.killpg(group, signum)
        except (ProcessLookupError, PermissionError):
            pass
    for victim in victims:  # a process that left its group is still reached
        try:
            victim.send_signal(signum)
        except psutil.Error:  # NoSuchProcess, AccessDenied: gone, or never ours
            pass


def _stop(processes, grace: float | None = None) -> None:
    """Stop each torchrun and every process under it. torchrun starts each worker in a session of
    its own, so signalling torchrun's group misses them, and a hung worker may ignore SIGTERM: so
    find every descendant first, SIGTERM their process groups (a worker's DataLoader workers are in
    its group), wait up to `grace` seconds, then SIGKILL whatever is left."""
    grace = STOP_GRACE_SECONDS if grace is None else grace
    victims = []
    for process in processes:
        try:
            parent = psutil.Process(process.pid)
            victims += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    own_group = os.getpgid(0)
    groups = set()
    for victim in victims:
        try:
            groups.add(os.getpgid(victim.pid))
        except (ProcessLookupError, PermissionError):
            pass
    groups.discard(own_group)  # never signal the process that launched them
    _signal_all(groups, victims, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_running(victim) for victim in victims) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [victim for victim in victims if _running(victim)]
    if left:
        _signal_all(groups, left, signal.SIGKILL)
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _rank_text(rank: int, local_rank: int | None, rank_lines: dict, log_dir: Path) -> list[str]:
    """Everything a rank printed: the streamed lines, else torchrun's per-rank log files."""
    lines = [line for line in rank_lines.get(rank, []) if not _PROFILER_CHATTER.match(line)]
    if lines or local_rank is None:
        return lines
    # Several nodes share log_dir; take the newest files of this local rank.
    found = []
    for stream in ("stdout.log", "stderr.log"):
        files = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/{stream}"), key=lambda p: p.stat().st_mtime)
        if files:
            found += files[-1].read_text(errors="replace").splitlines()
    return found


def _cause(failure: RankFailure, text: list[str]) -> str:
    """own | peer | stopped: did this rank fail by itself, because a peer went away, or was it stopped?"""
    if any(_HANDLED_ERROR.match(line) for line in text):
        return "own"  # the CLI's one-line error: bad input or a handled failure of this rank
    code = failure.exitcode or 0
    if code < 0:
        return "stopped" if -code in _STOP_SIGNALS else "own"  # SIGKILL (out of memory), SIGSEGV ... are its own
    if code > 0 and any(_PEER_GONE.search(line) for line in text[-60:]):
        return "peer"
    return "own"


def _failures(node_lines, rank_lines, log_dir: Path, last_lines: int, timed_out: bool,
              first_error_at: dict | None = None) -> list[RankFailure]:
    """Which ranks failed, the one whose own error came first at the top. torchrun's summary gives
    the ranks and exit codes; its "Root Cause" is the earliest error *file*, which blames a peer
    whenever the failing rank had no error file (a handled error, exit 2) or wrote it in the same
    second. So each failure is classified (`_cause`): its own error, a consequence of a peer going
    away, or stopped by torchrun; own errors are ordered by when their first error line arrived."""
    first_error_at = first_error_at or {}
    found: dict[int, RankFailure] = {}
    for text in ("\n".join(node) for node in node_lines):
        for rank, local_rank, code in _FAILURE.findall(text):
            rank = int(rank)
            if rank not in found:
                found[rank] = RankFailure(rank, int(local_rank), int(code), [])
    # A rank that printed the CLI's error line but is missing from the summary (stopped by torchrun
    # before it exited) still failed by itself.
    for rank, text in rank_lines.items():
        if rank not in found and any(_HANDLED_ERROR.match(line) for line in text):
            found[rank] = RankFailure(rank, None, None, [])
    if found:
        for failure in found.values():
            text = _rank_text(failure.rank, failure.local_rank, rank_lines, log_dir)
            failure.cause = _cause(failure, text)
            # A peer's traceback only says the connection went away: its last line is enough.
            failure.last_lines = text[-(1 if failure.cause == "peer" else last_lines):]
        order = {"own": 0, "peer": 1, "stopped": 2}
        ranked = sorted(found.values(), key=lambda f: (order[f.cause], first_error_at.get(f.rank, float("inf")),
                                                       f.rank))
        listed = [f for f in ranked if f.cause != "stopped"] or ranked
        listed[0].root_cause = True
        return listed
    # No summary (a timeout, or torchrun failing before its workers): ranks with a traceback,
    # else torchrun's own last lines.
    with_errors = [rank for rank, text in rank_lines.items() if any("Error" in line for line in text)]
    if with_errors and not timed_out:
        return [RankFailure(rank, None, None, rank_lines[rank][-last_lines:]) for rank in sorted(with_errors)]
    if timed_out:
        return [RankFailure(rank, None, None, text[-last_lines:]) for rank, text in sorted(rank_lines.items())] or \
            [RankFailure(None, None, None, [line for node in node_lines for line in node][-last_lines:])]
    return [RankFailure(None, None, None, [line for node in node_lines for line in node][-last_lines:])]
