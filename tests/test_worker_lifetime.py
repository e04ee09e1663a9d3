"""A process that sets its parent-death signal ends when its parent is SIGKILLed (the torchrun case is
in test_ddp.py::test_workers_end_with_their_agent_when_it_is_sigkilled); no torch, so it takes a second."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import ROOT

from course_lib.engine import worker_lifetime

CHILD = textwrap.dedent("""
    import sys, time
    from course_lib.engine.worker_lifetime import end_with_parent
    if sys.argv[1] == "guarded":
        assert end_with_parent()
    print("ready", flush=True)
    time.sleep(60)
""")
# The parent starts the child in a session of its own, as torchrun does, so only the signal can reach it.
PARENT = textwrap.dedent("""
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    print(child.pid, flush=True)
    sys.stdin.readline()
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("mode, survives", [("guarded", False), ("unguarded", True)])
@pytest.mark.slow
def test_a_child_with_the_parent_death_signal_ends_with_its_sigkilled_parent(mode, survives):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + (1.5 if survives else 5)  # a guarded child is gone in milliseconds
        while time.monotonic() < deadline and psutil.pid_exists(child) \
                and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.05)
        alive = psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE
        assert alive == survives  # unguarded: the orphan the issue found; guarded: gone with its parent
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_under_torchrun_reads_torchruns_environment():
    assert worker_lifetime.under_torchrun({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0"})
    assert not worker_lifetime.under_torchrun({"LOCAL_RANK": "0"})
