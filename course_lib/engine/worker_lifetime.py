"""A torchrun worker ends with its agent. torchrun starts each worker in a session of its own, so a
SIGKILLed agent (which cannot stop them) leaves them training, and writing checkpoints, for a run
already reported as failed. Linux's parent-death signal, `prctl(PR_SET_PDEATHSIG)`, has the kernel
kill a worker the moment its parent goes: https://man7.org/linux/man-pages/man2/prctl.2.html.
Imports nothing heavy: `python -m course_lib` calls it before torch is imported.
"""
from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Under torchrun: every worker's environment has these (torch.distributed.elastic sets them).
TORCHRUN_VARIABLES = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK")


def under_torchrun(environ=os.environ) -> bool:
    return all(name in environ for name in TORCHRUN_VARIABLES)


def end_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `signum` to this process when its parent dies; True when set. SIGKILL:
    a worker whose agent is gone cannot report anything, and a kill mid-save loses nothing (the
    checkpoint is written to a temp file and renamed). A parent already gone by now (the process was
    handed to init or a subreaper in between) ends this process at once. Linux only; elsewhere False."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died between the two calls: the signal will never come
        os.kill(os.getpid(), signum)
    return True
