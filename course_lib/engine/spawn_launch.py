"""The other way the article starts DDP's processes (A1 §4.2): `torch.multiprocessing.spawn` from the training
script itself, instead of an outside launcher (`torchrun`). Each spawned process sets the variables torchrun
would (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and runs the same `workbook ddp-probe` worker,
so the two launches differ only in how the processes start.

Spawn needs an importable worker function, which a notebook kernel does not have (functions defined in cells
live in `__main__`), so `launch` runs this module in a child Python:

    python -m course_lib.engine.spawn_launch 2 --task scaling --profile smoke

What spawn does not give, torchrun does: a rank that dies takes the others down only when `join` notices it
(no elastic restarts, no per-rank log files, no error-file summary naming the first failure), and one command
per node has to be written by hand for several machines.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time


def _worker(rank: int, world_size: int, port: int, probe_args: list[str]) -> None:
    """One spawned process: torchrun's variables for this rank, then the probe worker."""
    import runpy

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.argv = ["workbook", "ddp-probe", *probe_args]
    try:  # `python -m course_lib ddp-probe ...` in this process: the command line is the one entry point
        runpy.run_module("course_lib", run_name="__main__")
    except SystemExit as done:
        if done.code:
            raise


def main(argv: list[str] | None = None) -> int:
    """`python -m course_lib.engine.spawn_launch N <ddp-probe arguments>`: N processes by spawn, joined."""
    import torch.multiprocessing as mp

    from course_lib.engine.torchrun import free_port

    argv = sys.argv[1:] if argv is None else argv
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: python -m course_lib.engine.spawn_launch N <ddp-probe arguments> (N >= 1 processes)",
              file=sys.stderr)
        return 2
    nproc = int(argv[0])
    mp.spawn(_worker, args=(nproc, free_port("127.0.0.1"), argv[1:]), nprocs=nproc, join=True)
    return 0


def launch(nproc: int, params=None, profile: str | None = "auto", *, args: list[str] | tuple = (),
           threads_per_process: int | None = 1, timeout: float = 900.0) -> dict:
    """Run the probe under `mp.spawn` in a child Python (`main`), with the environment torchrun's launches get
    (`torchrun.worker_environment`: a fresh run id, the ledger, threads per process). Returns {"run_id",
    "seconds" (the whole launch, start-up included), "rows" (the ledger rows rank 0 recorded), "returncode",
    "output" (its last lines)}."""
    from course_lib import ledger, paths
    from course_lib.engine.torchrun import command_args, new_run_id, resolve_params, worker_environment

    _, params = resolve_params(params, profile)
    run_id = new_run_id()
    environment = worker_environment(run_id, threads_per_process)
    command = [sys.executable, "-m", "course_lib.engine.spawn_launch", str(nproc),
               *command_args("ddp-probe", params, profile, list(args))]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=paths.project_root(), env=environment, capture_output=True, text=True,
                          timeout=timeout, check=False)
    seconds = time.perf_counter() - started
    rows = ledger.Ledger(environment[ledger.LEDGER_ENV]).rows(run_id=run_id)
    return {"run_id": run_id, "seconds": seconds, "rows": rows, "returncode": done.returncode,
            "output": (done.stdout + done.stderr).splitlines()[-15:]}


if __name__ == "__main__":
    raise SystemExit(main())
