"""tests/forkserver.py, the fork server the slow tests start their kernels and README commands from: a program
forked from it gets its caller's arguments, streams, environment, folder and exit status, signals sent to the
caller reach it, it dies with its caller, and a kernel forked from it draws figures inline."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import conftest
import nbformat
import pytest
from conftest import FORKSERVER
from forkserver import SOCKET_ENV, forked_argv

from course_lib import runner

PROGRAM = """import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("FORK_TEST"), "torch", "torch" in sys.modules,
      "matplotlib", "matplotlib" in sys.modules, flush=True)
print("to stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    print(os.getpid(), flush=True)
    time.sleep(120)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def server(fork_server):
    """This test process's server (tests/conftest.py), once it accepts."""
    if fork_server is None:
        pytest.skip("no fork server in this session (WORKBOOK_FORK_SERVER=off, or the python3 kernel is another "
                    "interpreter's)")
    deadline = time.monotonic() + 180
    while not fork_server.exists():
        assert time.monotonic() < deadline, f"the fork server did not start in 180 s: {fork_server.parent}/server.log"
        time.sleep(0.2)
    return fork_server


@pytest.fixture
def program(tmp_path):
    (tmp_path / "program.py").write_text(PROGRAM)
    return str(tmp_path / "program.py")


def test_forked_argv_takes_this_interpreter_and_workbook_and_leaves_the_rest():
    on = {SOCKET_ENV: "/tmp/socket"}
    stand_in = [sys.executable, str(FORKSERVER), "run"]
    assert forked_argv([sys.executable, "x.py", "-p"], on) == [*stand_in, "x.py", "-p"]
    workbook = os.path.join(os.path.dirname(sys.executable), "workbook")
    assert forked_argv(["workbook", "doctor"], on) == ([*stand_in, workbook, "doctor"] if os.path.isfile(workbook)
                                                      else ["workbook", "doctor"])
    for other in (["torchrun", "--standalone", "x.py"], ["make", "test"], ["bash", "-c", "true"]):
        assert forked_argv(other, on) == other
    assert forked_argv([sys.executable, "x.py"], {SOCKET_ENV: "off"}) == [sys.executable, "x.py"]
    assert forked_argv([sys.executable, "x.py"], {}) == [sys.executable, "x.py"]


@pytest.mark.slow
def test_a_forked_program_gets_the_callers_arguments_streams_environment_folder_and_exit_status(server, program,
                                                                                               tmp_path):
    env = {**os.environ, SOCKET_ENV: str(server), "FORK_TEST": "here"}
    done = subprocess.run(forked_argv([sys.executable, program, "3", "x y"], env), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    # torch was imported before the program's first line: the server's child, not a fresh interpreter
    assert done.stdout == f"argv ['3', 'x y'] cwd {tmp_path} env here torch True matplotlib False\n"
    assert done.stderr == "to stderr\n"


@pytest.mark.slow
def test_a_caller_that_comes_while_the_server_imports_waits_for_its_fork(program, tmp_path):
    """The server listens before its imports (seconds): a caller in that time is forked once they are done, instead
    of importing the same beside them in a fresh interpreter."""
    socket_path = tmp_path / "server"
    server = subprocess.Popen([sys.executable, str(FORKSERVER), "serve", str(socket_path)], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        maps = f"/proc/{server.pid}/maps"  # Linux: the libraries the server has loaded so far
        assert not os.path.exists(maps) or "libtorch" not in open(maps).read(), "it listened only after its imports"
        env = {**os.environ, SOCKET_ENV: str(socket_path), "FORK_TEST": "early"}
        done = subprocess.run([sys.executable, str(FORKSERVER), "run", program, "0"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.stdout == f"argv ['0'] cwd {tmp_path} env early torch True matplotlib False\n", done.stderr
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.mark.slow
def test_the_sessions_processes_share_one_server_that_the_session_stops(server, tmp_path):
    """The folder the controlling process named (every pytest-xdist process of the session inherits it) holds the
    one server; `_stop_fork_server` ends a server that is not its caller's child and removes the folder."""
    assert server.parent == Path(os.environ[conftest.FORK_FOLDER_ENV])
    assert conftest._alive(int((server.parent / "server.pid").read_text()))
    folder = tmp_path / "fork"
    folder.mkdir()
    # A stand-in started, as under pytest-xdist, by another process: a shell that leaves it running and exits.
    started = subprocess.run(["sh", "-c", "sleep 120 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    (folder / "server.pid").write_text(started.stdout.strip())
    conftest._stop_fork_server(folder)
    assert not conftest._alive(int(started.stdout)) and not folder.exists()


@pytest.mark.slow
def test_without_a_server_run_is_a_fresh_interpreter(program, tmp_path):
    env = {**os.environ, SOCKET_ENV: str(tmp_path / "no-server"), "FORK_TEST": "here"}
    done = subprocess.run([sys.executable, str(FORKSERVER), "run", program, "0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, f"argv ['0'] cwd {tmp_path} env here torch False matplotlib False\n")


def _gone(pid: int, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_a_signal_to_the_caller_reaches_the_child_and_the_child_dies_with_its_caller(server, program, tmp_path):
    env = {**os.environ, SOCKET_ENV: str(server)}
    for ending in ("interrupt", "kill"):
        caller = subprocess.Popen(forked_argv([sys.executable, program, "sleep"], env), env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        caller.stdout.readline()
        child = int(caller.stdout.readline())
        if ending == "interrupt":  # KeyboardInterrupt in the child, which then dies of SIGINT: so does the caller
            caller.send_signal(signal.SIGINT)
            assert caller.wait(timeout=60) == -signal.SIGINT
            assert "KeyboardInterrupt" in caller.stderr.read()
        else:  # a kernel manager's SIGKILL: the child notices and kills its process group
            caller.kill()
            caller.wait(timeout=60)
        caller.stdout.close(), caller.stderr.close()
        assert _gone(child), f"the forked child {child} outlived its caller ({ending})"


@pytest.mark.slow
def test_a_kernel_from_the_server_starts_with_torch_imported_and_draws_figures_inline(server, tmp_path):
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                 "display_name": "Python 3 (ipykernel)"}})
    notebook.cells = [nbformat.v4.new_code_cell('profile = ""', metadata={"tags": ["parameters"]}),
                      nbformat.v4.new_code_cell('import sys\nprint("torch" in sys.modules)'),
                      nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")]
    nbformat.write(notebook, tmp_path / "kernel.ipynb")
    result = runner.execute_notebook(tmp_path / "kernel.ipynb", tmp_path / "out.ipynb", {"profile": "smoke"})
    assert result.status == "ok", result.error
    cells = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells
    printed = [output.get("text") for cell in cells for output in cell.outputs if output.output_type == "stream"]
    assert printed == ["True\n"]
    assert any("image/png" in output.get("data", {}) for output in cells[-1].outputs), "no inline figure"


def test_only_module_and_script_runs_without_a_start_up_hook_are_forked(tmp_path):
    from forkserver import runnable

    assert runnable(["-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "k.json"], {})
    assert runnable(["-u", "-m", "course_lib", "ddp-probe"], {}) and runnable(["x.py", "-c"], {})
    assert runnable(["-u", "-m", "course_lib", "ddp-probe", "--task", "equivalence"], {})
    # The scaling probe's torchrun agent profiles nothing: forked (its workers, below, are not).
    assert runnable(["-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "course_lib", "ddp-probe",
                     "--task", "scaling"], {})
    for other in (["-c", "print(1)"], ["-E", "x.py"], ["-m"], ["-u"], [],
                  ["-u", "-m", "course_lib", "ddp-probe", "--task", "scaling", "--steps", "2"]):  # its profiler
        assert not runnable(other, {}), other
    (tmp_path / "sitecustomize.py").write_text("")  # tests/fixtures/ddp_faults: a fresh interpreter runs the hook
    assert not runnable(["-m", "course_lib"], {"PYTHONPATH": f"/nowhere{os.pathsep}{tmp_path}"})


THREADS = """import os, sys, time, torch
print("forked", "timm" in sys.modules, "threads", torch.get_num_threads(), "own python forked",
      sys.executable == os.environ["PYTHON_EXEC"])
time.sleep(30)
"""


@pytest.mark.slow
def test_the_written_python_forks_torchruns_unbuffered_workers_with_their_thread_count(server, tmp_path):
    """PYTHON_EXEC, as torch.distributed.run starts a worker: `-u -m MODULE`. The first line arrives while the
    child still runs (unbuffered), the child has the server's imports, OMP_NUM_THREADS sets its torch, and its own
    `sys.executable` is that python (a kernel's `[sys.executable, "-m", "torch.distributed.run", ...]` is forked)."""
    import forkserver

    (tmp_path / "threads_probe.py").write_text(THREADS)
    python = forkserver.interpreter(str(tmp_path))
    env = {**os.environ, SOCKET_ENV: str(server), "OMP_NUM_THREADS": "3", "PYTHONPATH": str(tmp_path),
           "PYTHON_EXEC": python}
    worker = subprocess.Popen([python, "-u", "-m", "threads_probe"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              text=True)
    try:
        # 3 threads: neither 1 (a test worker's) nor the cores
        assert worker.stdout.readline() == "forked True threads 3 own python forked True\n"
    finally:
        worker.kill()
        worker.wait(timeout=60)
        worker.stdout.close()


AGENT = """import subprocess, sys
worker = subprocess.Popen([sys.argv[1], "-u", "-m", "threads_probe"], start_new_session=True, stdout=subprocess.PIPE,
                          text=True)
print(worker.stdout.readline().strip(), worker.pid, flush=True)
sys.stdin.readline()
"""
SLEEPER = """import os, time
print(os.getpid(), flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_forked_torchrun_worker_ends_with_its_sigkilled_agent(server, tmp_path):
    """As `worker_lifetime.end_with_parent` makes a fresh worker do: the stand-in dies with the agent that started it
    in a session of its own, and the forked worker with the stand-in."""
    import forkserver

    (tmp_path / "threads_probe.py").write_text(SLEEPER)
    path = os.pathsep.join([str(tmp_path), str(FORKSERVER.parents[1])])  # the probe, and course_lib for the stand-in
    env = {**os.environ, SOCKET_ENV: str(server), "PYTHONPATH": path, "TORCHELASTIC_RUN_ID": "test", "LOCAL_RANK": "0"}
    agent = subprocess.Popen([sys.executable, "-c", AGENT, forkserver.interpreter(str(tmp_path))], env=env,
                             cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    worker, stand_in = (int(pid) for pid in agent.stdout.readline().split())
    try:
        assert worker != stand_in  # forked: the worker is the server's child, not the agent's
        agent.kill()
        agent.wait(timeout=60)
        assert _gone(stand_in, 10) and _gone(worker, 10), "a forked worker outlived its SIGKILLed agent"
    finally:
        for pid in (worker, stand_in):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        agent.stdin.close(), agent.stdout.close()
