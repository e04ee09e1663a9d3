"""A fork server for the tests that start Python processes (issue 46): every notebook's kernel and the README's
commands. Each of those processes spent about 4 s of a 2-core machine importing torch, torchvision, timm, pandas,
scikit-learn and ipykernel before its first line of work; a child forked from a server that imported them once
starts with them in place.

  python tests/forkserver.py serve SOCKET         import PRELOAD, then fork one child per request on SOCKET
  python tests/forkserver.py run PROGRAM [ARG...]  stands in for `python PROGRAM ARG...` (a script, or -m MODULE)
  FOLDER/python ARG...                            the same as a program: `interpreter(FOLDER)` writes it

`interpreter(FOLDER)` writes a `python` that runs `forkserver.py run`: `tests/conftest.py` names it in PYTHON_EXEC,
the interpreter torchrun's agent starts its workers with (torch.distributed.run), so every worker of a test's DDP
launch is forked too (each spent about 4 s of CPU importing torch, timm and course_lib).

`run` is a small process that imports nothing heavy: it sends the server its arguments, environment, working
folder and standard streams (the file descriptors themselves), and the child the server forks becomes that program
in a session of its own. `run` forwards the signals it gets to the child, exits with the child's exit status, and
the child kills its whole process group when `run` dies (a kernel manager's SIGKILL). Without a server (the
WORKBOOK_FORK_SERVER socket unset, not there yet or refusing) `run` replaces itself with a fresh interpreter: the
same program, slower. The server listens from its start: a caller that comes while it imports waits for it.
`tests/conftest.py` (`fork_server`) starts one server per session, shared by its pytest-xdist processes, and
points the `python3` kernel at `run`; `WORKBOOK_FORK_SERVER=off` turns it off.

A forked child's `sys.executable` is that written python too (when PYTHON_EXEC names it), so what it starts as
`[sys.executable, ...]` (a kernel's torchrun agent) is forked as well; `-c` and other forms `run` cannot fork still
get a fresh interpreter. A forked child takes torch's thread count from OMP_NUM_THREADS in its caller's environment,
as a fresh interpreter would (torchrun's `threads_per_process`). A torchrun worker's stand-in ends with its agent
(parent-death signal): `course_lib.engine.worker_lifetime` does that in the worker itself, whose parent here is
the server.

The server freezes what it imported (`gc.freeze`), so no child's collection walks those objects, and a child
freezes the rest before it exits, as `course_lib.cli.main` does for a command of its own process.

matplotlib is never preloaded: it reads MPLBACKEND once, at import, and a kernel sets it (the inline backend)
after the fork.
"""
import gc
import json
import os
import select
import signal
import socket
import sys

SOCKET_ENV = "WORKBOOK_FORK_SERVER"
PRELOAD = ("torch", "torchvision", "timm", "numpy", "pandas", "PIL.Image", "scipy.stats", "sklearn.metrics",
           "IPython", "ipykernel.kernelapp", "nbformat")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
MESSAGE_BYTES = 1 << 20
CONSOLE_SCRIPTS = ("workbook",)  # `forked_argv`: torchrun's agent stays a process of its own


def serve(path: str):
    """Import PRELOAD, then answer requests until killed. Returns only in a forked child: (request, fds)."""
    import importlib

    # Listening before the imports: a caller that comes while they run waits in the queue for its fork (a fresh
    # interpreter would import the same beside them, on the same cores); if they fail, the queue's callers see the
    # socket close and start fresh interpreters (`run`).
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)
    for name in PRELOAD:
        importlib.import_module(name)
    if "matplotlib" in sys.modules:
        raise SystemExit("forkserver: a preloaded module imported matplotlib; its backend would be fixed too early")
    gc.freeze()  # the preloaded objects: no child's collection walks them (nor writes to their pages)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    while True:
        ready = select.select([listener, wake_read], [], [])[0]
        if wake_read in ready:
            os.read(wake_read, 4096)
            _reap(children)
        if listener in ready:
            connection = listener.accept()[0]
            message, fds, _, _ = socket.recv_fds(connection, MESSAGE_BYTES, 3)
            if not message or len(fds) != 3:  # a caller that went away before asking
                connection.close()
                for fd in fds:
                    os.close(fd)
                continue
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for other in (listener, connection, *children.values()):
                    other.close()
                os.close(wake_read), os.close(wake_write)
                return json.loads(message), fds
            for fd in fds:
                os.close(fd)
            children[pid] = connection
            try:
                connection.send(f"{pid}".encode())
            except OSError:  # the caller is gone: its child notices (`become`)
                pass


def _reap(children: dict) -> None:
    """Tell each finished child's `run` its exit status (negative: the signal that ended it)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if (connection := children.pop(pid, None)) is not None:
            try:
                connection.send(str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:
                pass
            connection.close()


def become(request: dict, fds: list[int]) -> None:
    """In the forked child: the caller's streams, environment, folder and import path, a session of its own, and
    death with the caller."""
    import threading

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    served_pythonpath = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    wanted = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [""] + wanted + [entry for entry in sys.path[1:] if entry and entry not in served_pythonpath]

    def die_with_caller(pid=request["caller"]):
        try:
            select.select([os.pidfd_open(pid)], [], [])
        except OSError:  # already gone
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=die_with_caller, daemon=True).start()
    if os.environ.get("PYTHON_EXEC"):  # the tests' written python: what a kernel starts as `[sys.executable, ...]`
        sys.executable = os.environ["PYTHON_EXEC"]  # (torchrun's agent, `-m course_lib`) is forked as well
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # a fresh torch reads it at start-up; this one read the server's
        import torch

        torch.set_num_threads(int(threads))


def _unbuffered() -> None:
    """`python -u`: standard output and error written through at once (torchrun starts its workers so)."""
    import io

    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=stream.encoding,
                                            errors=stream.errors, write_through=True))


def _options(argv: list[str]) -> list[str]:
    """The interpreter options a forked child can honour at the head of `python ARGV...`: -X... and -u."""
    count = 0
    while count < len(argv) and (argv[count].startswith("-X") or argv[count] == "-u"):
        count += 1
    return argv[:count]


def runnable(argv: list[str], environ=os.environ) -> bool:
    """Whether `run_program` can run `python ARGV...`: interpreter options -X... and -u only, then -m MODULE or a
    script. Anything else (`-c CODE`, other options) is a fresh interpreter's (`run`), and so is a program whose
    PYTHONPATH holds a sitecustomize.py: a start-up hook (tests/fixtures/ddp_faults) a forked child never runs.
    So is a worker of the DDP scaling probe (`-m course_lib ddp-probe --task scaling`), which runs torch.profiler:
    once in about ten clean-clone runs a forked worker's heap was corrupt when its profiler stopped (glibc "malloc():
    unsorted double linked list corrupted", SIGABRT in `_communication_share`); kineto keeps per-process state
    that a fork copies (pytorch/kineto#998). Its torchrun agent, which profiles nothing, is forked."""
    argv = argv[len(_options(argv)):]
    hooked = any(os.path.isfile(os.path.join(entry, "sitecustomize.py"))
                 for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry)
    profiled = argv[:3] == ["-m", "course_lib", "ddp-probe"] and "scaling" in argv
    return bool(argv) and not hooked and not profiled and (argv[0] == "-m" and len(argv) > 1
                                                            or not argv[0].startswith("-"))


def run_program(argv: list[str]) -> None:
    """What `python ARGV...` runs: `-m MODULE ARG...` or `SCRIPT ARG...`, as __main__. Interpreter options
    (`-X...`, as the kernelspec's `-Xfrozen_modules=off`) are the server's: `conftest.fork_server` starts it with
    the kernel's."""
    import runpy

    options = _options(argv)
    if "-u" in options:
        _unbuffered()
    argv = argv[len(options):]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def forked_argv(argv: list[str], env: dict) -> list[str]:
    """A command line as `forkserver.py run ...` when `env` names a server: this interpreter's (`python ARG...`) or
    a console script of its environment in CONSOLE_SCRIPTS (`workbook ARG...`). Any other command, unchanged."""
    if env.get(SOCKET_ENV, "off") == "off":
        return argv
    stand_in = [sys.executable, os.path.abspath(__file__), "run"]
    script = os.path.join(os.path.dirname(sys.executable), argv[0])
    if argv[0] == sys.executable:
        return [*stand_in, *argv[1:]]
    if argv[0] in CONSOLE_SCRIPTS and os.path.isfile(script):
        return [*stand_in, script, *argv[1:]]
    return argv


def interpreter(folder: str) -> str:
    """Write FOLDER/python, a `python` that goes through the server (`run`); its path."""
    path = os.path.join(folder, "python")
    with open(path, "w") as script:
        script.write(f'#!/bin/sh\nexec "{sys.executable}" "{os.path.abspath(__file__)}" run "$@"\n')
    os.chmod(path, 0o755)
    return path


def _end_with_parent_under_torchrun() -> None:
    """A torchrun worker's stand-in gets SIGKILL when the agent dies: `python -m course_lib` does that in the worker
    itself, whose parent is the server here (the module imports nothing heavy)."""
    from course_lib.engine.worker_lifetime import end_with_parent, under_torchrun

    if under_torchrun():
        end_with_parent()


def run(argv: list[str]) -> None:
    """Have the server fork `python ARGV...` with this process's streams, environment and folder; wait for it."""
    if not runnable(argv):
        os.execv(sys.executable, [sys.executable, *argv])
    _end_with_parent_under_torchrun()
    path = os.environ.get(SOCKET_ENV, "")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "caller": os.getpid()}
    try:
        server.connect(path)
        socket.send_fds(server, [json.dumps(request).encode()], [0, 1, 2])
    except OSError:  # no server (unset, "off", not started yet or gone): a fresh interpreter instead
        os.execv(sys.executable, [sys.executable, *argv])
    reply = server.recv(64)
    if not reply:  # the server went away before forking
        os.execv(sys.executable, [sys.executable, *argv])
    child = int(reply)
    for number in FORWARDED:
        signal.signal(number, lambda received, _frame: os.kill(child, received))
    reply = server.recv(64)
    code = int(reply) if reply else 1
    if code < 0:  # the child died of a signal: so does this process, as a parent would see it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        forked = serve(sys.argv[2])
        become(*forked)
        try:
            run_program(forked[0]["argv"])
        finally:
            gc.freeze()  # as course_lib.cli.main does: Python's collections at exit took about 0.9 s
    elif sys.argv[1:2] == ["run"] and len(sys.argv) > 2:
        run(sys.argv[2:])
    else:
        raise SystemExit("usage: forkserver.py serve SOCKET | forkserver.py run PROGRAM [ARG...]")
