"""DDP measured: how DistributedSampler shards the data, that N workers train like one (the
equivalence check), and how well training scales (time per epoch for 1..N workers, strong and weak
efficiency, the all-reduce share of a step). Each measurement is one or more `torchrun.launch`es of
`workbook ddp-probe` or `workbook train`; notebook 05's claims and advice are `chapters.ddp_scaling`.
DDP: https://pytorch.org/docs/stable/notes/ddp.html (Li et al. 2020, arXiv:2006.15704).
"""
from __future__ import annotations

import dataclasses
import os
import secrets

from course_lib import machine, paths
from course_lib.config import ConfigError
from course_lib.engine.torchrun import LaunchError, LaunchResult, launch, resolve_params


def sampler_shards(count: int, world_size: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True,
                   drop_last: bool = False) -> list[list[int]]:
    """The indices each rank's DistributedSampler yields in `epoch` (no process group needed)."""
    from torch.utils.data import DistributedSampler

    shards = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(count), num_replicas=world_size, rank=rank, shuffle=shuffle,
                                     seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def shard_report(count: int, world_size: int, *, seed: int = 0, drop_last: bool = False, epochs: int = 2) -> dict:
    """Are the shards disjoint, do they cover the data, and does `set_epoch` change the order?
    With `count` not divisible by `world_size`, drop_last=False pads by repeating indices and
    drop_last=True leaves the tail out of that epoch."""
    per_epoch = [sampler_shards(count, world_size, epoch=e, seed=seed, drop_last=drop_last) for e in range(epochs)]
    shards = per_epoch[0]
    union = [index for shard in shards for index in shard]
    return {
        "images": count, "world_size": world_size, "drop_last": drop_last,
        "per_rank": len(shards[0]),
        "disjoint": len(union) == len(set(union)),
        "covers_all": set(union) == set(range(count)),
        "repeated": len(union) - len(set(union)),
        "left_out": count - len(set(union)),
        "order_changes_with_epoch": all(per_epoch[e][0] != per_epoch[e - 1][0] for e in range(1, epochs)),
    }


def check_equivalence(nproc: int = 2, params: dict | None = None, profile: str | None = "smoke", *,
                      steps: int = 3, nnodes: int = 1, tolerance: float = 1e-5, echo=print,
                      timeout: float = 300) -> dict:
    """Train a small CNN without BatchNorm for `steps` SGD steps with DDP (nproc x nnodes workers,
    under torchrun) and with 1 worker on the same global batches; compare the weights. With
    `params={"sync_batchnorm": True}` the CNN has BatchNorm, synchronised across the workers: its
    statistics are the global batch's, so DDP must still equal one worker (running statistics included)."""
    import torch

    from course_lib.engine import ddp_probe

    config, params = resolve_params(params, profile)
    world_size = nproc * nnodes
    out = paths.project_root() / "runs" / "ddp_probe" / secrets.token_hex(4)
    result = launch(nproc, params, profile, command="ddp-probe", nnodes=nnodes, echo=echo,
                    args=["--task", "equivalence", "--steps", str(steps), "--out", str(out)], timeout=timeout)
    ddp_weights = torch.load(out / "ddp_weights.pt", map_location="cpu", weights_only=True)
    reference = ddp_probe.single_worker_weights(ddp_probe.equivalence_settings(config, steps))
    difference = max((ddp_weights[k] - reference[k]).abs().max().item() for k in reference)
    initial = _initial_distance(ddp_probe, config, steps, reference)
    return {"world_size": world_size, "nnodes": nnodes, "steps": steps, "global_batch": config.batch_size,
            "max_abs_difference": difference, "tolerance": tolerance, "equal": difference <= tolerance,
            "weights_moved": initial, "run_id": result.run_id, "launch": result}


def _initial_distance(ddp_probe, config, steps, reference) -> float:
    """How far training moved the weights: the difference above is small relative to this."""
    import torch

    settings = ddp_probe.equivalence_settings(config, steps)
    torch.manual_seed(settings["seed"])
    start = ddp_probe.small_cnn(settings["num_classes"], batchnorm=settings["batchnorm"]).state_dict()
    return max((reference[k] - start[k]).abs().max().item() for k in reference)


@dataclasses.dataclass
class ScalingReport:
    table: object  # pandas DataFrame: one row per (mode, workers)
    communication: dict  # the all-reduce share at the largest world size (empty for 1 worker)
    device: str
    precision: str
    hardware: str
    launch: LaunchResult
    load_average: float | None = None  # 1-minute load average right after the run (this run's workers included)

    def efficiency(self, mode: str = "strong") -> float:
        rows = self.table[self.table["mode"] == mode]
        return float(rows.sort_values("workers")["efficiency"].iloc[-1])


def scaling_table(rows: list[dict], epoch_images: int) -> object:
    """Add time per epoch, speed-up and efficiency to measured step times.
    strong (same global batch): efficiency = T1 / (N x TN), T = time per epoch of `epoch_images`;
    weak (same per-worker batch): efficiency = throughput_N / (N x throughput_1), which is the
    same formula with T the time for N times the data."""
    import pandas as pd

    table = pd.DataFrame([{k: v for k, v in row.items() if k != "step_seconds_all"} for row in rows])
    table["images_per_second"] = table["global_batch"] / table["step_seconds"]
    table["epoch_seconds"] = epoch_images / table["images_per_second"]
    out = []
    for mode, part in table.groupby("mode", sort=False):
        part = part.sort_values("workers").copy()
        base = part[part["workers"] == 1]
        if base.empty:
            raise ConfigError(f"{mode} scaling needs a 1-worker row to compare against")
        base = base.iloc[0]
        if mode == "strong":
            part["speedup"] = base["epoch_seconds"] / part["epoch_seconds"]
            part["efficiency"] = base["epoch_seconds"] / (part["workers"] * part["epoch_seconds"])
        else:
            part["speedup"] = part["images_per_second"] / base["images_per_second"]
            part["efficiency"] = part["images_per_second"] / (part["workers"] * base["images_per_second"])
        out.append(part)
    columns = ["mode", "workers", "per_worker_batch", "global_batch", "step_seconds", "epoch_seconds",
               "images_per_second", "speedup", "efficiency"]
    return pd.concat(out, ignore_index=True)[columns]


def measure_scaling(nproc: int, params: dict | None = None, profile: str | None = "auto", *, steps: int = 5,
                    warmup: int = 2, profile_steps: int = 3, global_batch: int | None = None,
                    epoch_images: int | None = None, threads_per_process: int | None = 1, echo=print,
                    timeout: float | None = None) -> ScalingReport:
    """One torchrun launch of `nproc` workers that times training steps for 1..nproc workers
    (subgroups of the launched ranks; idle ranks wait in a barrier) at the same global batch
    (strong) and at the same per-worker batch (weak), then profiles the all-reduce at nproc.
    Time per epoch = images per epoch / measured images per second."""
    config, params = resolve_params(params, profile)
    global_batch = global_batch or config.batch_size * nproc
    args = ["--task", "scaling", "--steps", str(steps), "--warmup", str(warmup),
            "--profile-steps", str(profile_steps), "--global-batch", str(global_batch)]
    result = launch(nproc, params, profile, command="ddp-probe", args=args, echo=echo, timeout=timeout,
                    threads_per_process=threads_per_process)
    metrics = result.metrics
    if not metrics.get("rows"):
        raise LaunchError(f"the scaling probe recorded no measurements (run id {result.run_id})")
    if epoch_images is None:
        from course_lib.data.pipeline import build_datasets

        # Counting only: loose files, so storage=cache/shards in the config builds nothing here.
        epoch_images = len(build_datasets(config.replace(storage="files", decoder="pil")).train)
    table = scaling_table(metrics["rows"], epoch_images)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return ScalingReport(table=table, communication=metrics.get("communication") or {}, device=metrics["device"],
                         precision=metrics["precision"], hardware=machine.describe_hardware(), launch=result,
                         load_average=load)


def engine_scaling(worker_counts: list[int], params: dict | None = None, profile: str | None = "auto", *,
                   global_batch: int | None = None, threads_per_process: int | None = 1, echo=print,
                   timeout: float | None = None) -> object:
    """Real epochs of the training engine (`workbook train` under torchrun), one launch per
    (workers, per-worker batch): the epoch time and images/s the ledger recorded. Slower than
    `measure_scaling` (a launch per point) but includes the input pipeline."""
    config, params = resolve_params(params, profile)
    global_batch = global_batch or config.batch_size * max(worker_counts)
    rows, done = [], {}
    for n in sorted(worker_counts):
        for mode, per_worker in (("strong", global_batch // n), ("weak", config.batch_size)):
            if per_worker < 1:
                continue
            if (n, per_worker) not in done:
                result = launch(n, {**params, "batch_size": per_worker}, profile, echo=echo, timeout=timeout,
                                threads_per_process=threads_per_process)
                done[(n, per_worker)] = result.metrics
            metrics = done[(n, per_worker)]
            rows.append({"mode": mode, "workers": n, "per_worker_batch": per_worker,
                         "global_batch": per_worker * n, "optimizer_steps": metrics["optimizer_steps"],
                         "epoch_seconds": metrics["epoch_seconds"], "images_per_second": metrics["images_per_second"],
                         "data_wait_fraction": metrics.get("data_wait_fraction")})
    import pandas as pd

    table = pd.DataFrame(rows)
    for mode, part in table.groupby("mode"):
        base = part[part["workers"] == 1].iloc[0]
        # Per image, so that runs with a different number of steps per epoch still compare.
        table.loc[part.index, "efficiency"] = part["images_per_second"] / (part["workers"] * base["images_per_second"])
    return table


def efficiency_interval(report: ScalingReport, mode: str = "strong") -> dict | None:
    """Scaling efficiency at the largest world size with a bootstrap interval over the probe's repeated
    step times: images/s at N over N x images/s at 1 (`statistics.ratio_interval`). None when the probe
    kept fewer than 2 step times per setting."""
    from course_lib.analysis import statistics

    rows = (report.launch.metrics.get("rows") if report.launch is not None else None) or []
    rows = [row for row in rows if row["mode"] == mode and len(row.get("step_seconds_all") or []) >= 2]
    single = [row for row in rows if row["workers"] == 1]
    if not rows or not single:
        return None
    largest = max(rows, key=lambda row: row["workers"])
    workers = largest["workers"]
    speeds = [largest["global_batch"] / seconds for seconds in largest["step_seconds_all"]]
    scaled = [workers * single[0]["global_batch"] / seconds for seconds in single[0]["step_seconds_all"]]
    interval = statistics.ratio_interval(speeds, scaled)
    return {"efficiency": interval["ratio"], "low": interval["low"], "high": interval["high"], "workers": workers}


def dataparallel_steps(config, gpus: int, global_batch: int, *, steps: int = 5, warmup: int = 2) -> list[float] | None:
    """Step times of `nn.DataParallel` over the first `gpus` CUDA devices at `global_batch`, with the scaling
    probe's harness (`StepBench`, random images already on the GPU): one process that copies the model to every
    GPU, scatters each batch and gathers the outputs on GPU 0 every step. None without that many CUDA GPUs:
    on a CPU DataParallel runs the module as it is, so there is nothing to compare."""
    import torch

    from course_lib.engine import auto_precision
    from course_lib.engine.step_bench import StepBench
    from course_lib.models.factory import build_model

    if gpus < 2 or not torch.cuda.is_available() or torch.cuda.device_count() < gpus:
        return None
    device = torch.device("cuda", 0)
    torch.manual_seed(config.seed)
    model = build_model(config, num_classes=8).to(device)
    precision = auto_precision.resolve(config.precision, model, config.image_size, 8, device,
                                       batch_size=config.batch_size, channels_last=config.channels_last)
    bench = StepBench(model, config.image_size, global_batch, device, 8, seed=config.seed)
    timed = bench.variant(precision, config.channels_last,
                          wrap=lambda replica: torch.nn.DataParallel(replica, device_ids=list(range(gpus))))
    return timed.redraw(global_batch).time(repeats=steps, warmup=warmup).seconds
