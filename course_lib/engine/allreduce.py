"""What one all-reduce costs against its message size, measured the way nccl-tests' `all_reduce_perf` reports
it: the time of one all-reduce of a float32 tensor from 1 KiB to 256 MiB, its algorithm bandwidth (bytes / time)
and its bus bandwidth (algorithm bandwidth x 2(n-1)/n, the traffic each link of a ring carries, comparable across
process counts and with the link's own speed). The worker runs under torchrun (`workbook ddp-probe --task
bandwidth`, gloo on CPU, NCCL on GPUs); `measure` launches it and reads back the ledger row.

Small messages are latency-bound (the time hardly depends on the size), large ones bandwidth-bound (the bus
bandwidth levels off). DDP all-reduces its gradients in buckets of 25 MiB (`bucket_cap_mb`), so where a model's
gradient and those buckets sit on this curve says which regime its steps pay for.

nccl-tests: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md (algbw, busbw).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time

MIB = 2 ** 20
SIZES = tuple(1024 * 4 ** k for k in range(10))  # 1 KiB, 4 KiB ... 256 MiB, as nccl-tests sweeps by factors
DDP_BUCKET_BYTES = 25 * MIB  # DistributedDataParallel(bucket_cap_mb=25): the largest message a step sends
LARGE_BYTES = 4 * MIB  # from here on each size is timed fewer times (one 256 MiB all-reduce on gloo takes ~0.5 s)


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(n-1)/n: a ring all-reduce sends and receives that many
    times the message over each link (0 for one process: nothing crosses a link)."""
    return 2 * (world_size - 1) / world_size


def sizes_up_to(max_bytes: int) -> list[int]:
    """The sweep's sizes (`SIZES`) up to `max_bytes`; at least the smallest."""
    return [size for size in SIZES if size <= max_bytes] or [SIZES[0]]


def worker(world_size: int, device, max_bytes: int, repeats: int, warmup: int) -> dict:
    """One rank's sweep (called by `engine.ddp_probe.run` inside the process group): every size is all-reduced
    `warmup` times untimed, then `repeats` times (a quarter of that, at least 3, from LARGE_BYTES on), each
    between barriers; a size's time is the slowest rank's median."""
    import torch
    import torch.distributed as dist

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for size in sizes_up_to(max_bytes):
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(tensor)
        times = []
        for _ in range(repeats if size < LARGE_BYTES else max(3, repeats // 4)):
            sync()
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(tensor)
            sync()
            times.append(time.perf_counter() - started)
        slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = float(slowest.item())
        algorithm = size / seconds / 1e9
        rows.append({"bytes": size, "seconds": seconds, "algbw_gb_per_s": algorithm,
                     "busbw_gb_per_s": algorithm * bus_factor(world_size), "repeats": len(times),
                     "seconds_all": times})
        del tensor
    return {"rows": rows, "backend": dist.get_backend(), "device": str(device), "world_size": world_size}


@dataclasses.dataclass
class BandwidthReport:
    """One sweep: a row per message size (bytes, seconds, algbw_gb_per_s, busbw_gb_per_s, repeats)."""

    table: object  # pandas DataFrame
    backend: str  # gloo | nccl
    device: str
    world_size: int
    hardware: str
    run_id: str
    samples: dict = dataclasses.field(default_factory=dict)  # bytes -> every timed repeat's seconds (rank 0's)
    measured_at: str = ""  # when the ledger recorded it (`newest`)

    @property
    def peak(self) -> float:
        """The highest bus bandwidth of the sweep, GB/s."""
        return float(self.table["busbw_gb_per_s"].max())

    def knee(self) -> int:
        """The smallest message whose bus bandwidth reaches half the sweep's peak: below it an all-reduce is
        latency-bound (its time barely falls with the size), from it on bandwidth-bound."""
        reached = self.table[self.table["busbw_gb_per_s"] >= self.peak / 2]
        return int(reached["bytes"].min())

    def seconds_for(self, size: float) -> float:
        """One all-reduce of `size` bytes, interpolated on log-log axes between the measured sizes (beyond the
        sweep: the nearest end's bus bandwidth)."""
        sizes, seconds = list(self.table["bytes"]), list(self.table["seconds"])
        if size <= sizes[0]:
            return seconds[0]
        if size >= sizes[-1]:
            return seconds[-1] * size / sizes[-1]
        upper = next(i for i, measured in enumerate(sizes) if measured >= size)
        share = (math.log(size) - math.log(sizes[upper - 1])) / (math.log(sizes[upper]) - math.log(sizes[upper - 1]))
        return math.exp(math.log(seconds[upper - 1]) + share * (math.log(seconds[upper]) - math.log(seconds[upper - 1])))

    def step_seconds(self, gradient_bytes: int, bucket_bytes: int = DDP_BUCKET_BYTES) -> float:
        """What all-reducing one step's gradients costs when nothing overlaps: full buckets of `bucket_bytes`
        and the rest, each one all-reduce."""
        full, rest = divmod(int(gradient_bytes), bucket_bytes)
        return full * self.seconds_for(bucket_bytes) + (self.seconds_for(rest) if rest else 0.0)

    @classmethod
    def from_metrics(cls, metrics: dict, hardware: str, run_id: str) -> BandwidthReport:
        """The report of a sweep's ledger row (`worker`'s result, as rank 0 recorded it)."""
        import pandas as pd

        table = pd.DataFrame(metrics["rows"]).drop(columns="seconds_all", errors="ignore")
        return cls(table=table, backend=metrics["backend"], device=metrics["device"],
                   world_size=int(metrics["world_size"]), hardware=hardware, run_id=run_id,
                   samples={row["bytes"]: row.get("seconds_all", []) for row in metrics["rows"]})

    def regime(self, size: int) -> str:
        return "bandwidth-bound" if size >= self.knee() else "latency-bound"

    def line(self) -> str:
        return (f"all-reduce over {self.world_size} {self.backend} processes on {self.device}: bus bandwidth up to "
                f"{self.peak:.2f} GB/s, half of it from {human_bytes(self.knee())} on; {self.hardware}")


def human_bytes(size: float) -> str:
    """1 KiB, 4 MiB, 46.8 MiB ..."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", MIB), ("KiB", 1024)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(size)} B"


def measure(nproc: int, params=None, profile: str | None = "auto", *, max_bytes: int = SIZES[-1], repeats: int = 12,
            warmup: int = 2, threads_per_process: int | None = 1, env: dict | None = None, echo=print,
            timeout: float | None = None) -> BandwidthReport:
    """One torchrun launch of `nproc` processes sweeping all-reduce sizes up to `max_bytes` (`worker`); `env`:
    extra environment for the workers (an NCCL setting)."""
    from course_lib import machine
    from course_lib.engine.torchrun import LaunchError, launch

    args = ["--task", "bandwidth", "--steps", str(repeats), "--warmup", str(warmup), "--max-bytes", str(max_bytes)]
    result = launch(nproc, params, profile, command="ddp-probe", args=args, echo=echo, timeout=timeout,
                    threads_per_process=threads_per_process, env=env)
    metrics = result.metrics
    if not metrics.get("rows"):
        raise LaunchError(f"the all-reduce probe recorded no measurements (run id {result.run_id})")
    return BandwidthReport.from_metrics(metrics, machine.describe_hardware(), result.run_id)


def newest(book=None) -> BandwidthReport | None:
    """The newest sweep the ledger holds from this machine (notebook 05, `workbook ddp --bandwidth`), else None.
    Only reads: no ledger yet, or one that cannot be opened, is None (`workbook ledger --check` says why)."""
    from course_lib import ledger, machine

    if book is None:
        if not ledger.default_path().is_file():
            return None
        try:
            book = ledger.Ledger()
        except ledger.LedgerError:
            return None
    here = machine.describe_hardware()
    for row in book.rows(kind="ddp", name="bandwidth", limit=100):
        if row["metrics"].get("rows") and machine.describe_hardware(row["hardware"]) == here:
            report = BandwidthReport.from_metrics(row["metrics"], here, row["run_id"] or "")
            return dataclasses.replace(report, measured_at=row["created_at"])
    return None
