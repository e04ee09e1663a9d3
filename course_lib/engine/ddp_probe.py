"""The worker that `course_lib.engine.ddp` launches under torchrun (`engine.torchrun`) to measure DDP itself: step time for
1..N workers in one launch, the gradient all-reduce's share of a step (torch.profiler, and the
exposed part from a `no_sync` step), and the weights after a few DDP steps (for the equivalence
check against 1-worker training). `course_lib.engine.train` is the real training engine; this module
isolates what DDP adds, on in-memory tensors, so the input pipeline does not blur the numbers.

    torchrun --nproc-per-node 2 -m course_lib ddp-probe --task scaling --profile smoke -p model=resnet18

DDP: Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training"
(arXiv:2006.15704); https://pytorch.org/docs/stable/notes/ddp.html.
"""
from __future__ import annotations

import gc
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record

from course_lib import ledger
from course_lib.config import ConfigError
from course_lib.engine.precision import grad_scaler
from course_lib.engine.step import optimizer_step, training_step
from course_lib.engine.step_bench import StepBench, TimedStep

TASKS = ("scaling", "equivalence", "bandwidth", "fail")
# Environment hook for tests and the notebook: this rank raises right after the rendezvous.
FAIL_RANK_ENV = "WORKBOOK_DDP_FAIL_RANK"
COMMUNICATION_NAMES = ("all_reduce", "allreduce")  # gloo:all_reduce, nccl:all_reduce, ncclDevKernel_AllReduce...


def small_cnn(num_classes: int = 4, width: int = 8, batchnorm: bool = False) -> torch.nn.Module:
    """Two convolutions and a linear head; no BatchNorm by default: with BatchNorm each DDP rank normalises
    with its own shard's statistics, so DDP would *not* equal 1-worker training, unless the BatchNorm is
    synchronised (`sync_batchnorm=True`: statistics over the global batch, exactly as one worker computes them)."""
    def norm():
        return [torch.nn.BatchNorm2d(width)] if batchnorm else []

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, width, 3, padding=1), *norm(), torch.nn.ReLU(),
        torch.nn.Conv2d(width, width, 3, padding=1, stride=2), *norm(), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(width, num_classes))


def synthetic_images(count: int, image_size: int = 16, num_classes: int = 4, seed: int = 0):
    """(images, labels): fixed random images whose mean depends on the class, so loss falls."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % num_classes
    images = torch.randn(count, 3, image_size, image_size, generator=generator) + labels.view(-1, 1, 1, 1) * 0.5
    return images, labels


def rank_batches(count: int, world_size: int, rank: int, batch_size: int, seed: int = 0,
                 epoch: int = 0) -> list[list[int]]:
    """The index batches rank `rank` of `world_size` draws in `epoch`, exactly as DDP training
    does: DistributedSampler (shuffled by seed and epoch, tail dropped), cut into batches."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(count), num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    indices = list(sampler)
    return [indices[i:i + batch_size] for i in range(0, len(indices) - batch_size + 1, batch_size)]


def sgd_steps(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
              batches: list[list[int]], lr: float = 0.05, momentum: float = 0.9) -> torch.nn.Module:
    """Plain fp32 SGD over the given index batches, with the engine's step; under DDP `backward`
    averages the gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    scaler = grad_scaler("off", images.device)  # disabled: passes every call straight through
    for batch in batches:
        training_step(model, images[batch], labels[batch], F.cross_entropy, scaler)
        optimizer_step(optimizer, scaler)
    return model


def equivalence_settings(config, steps: int) -> dict:
    """What both sides of the equivalence check use; global batch = config.batch_size."""
    return dict(count=max(64, 2 * steps * config.batch_size), image_size=16, num_classes=4, seed=config.seed,
                global_batch=config.batch_size, steps=steps, lr=0.05, batchnorm=config.sync_batchnorm)


def single_worker_weights(settings: dict) -> dict:
    """Plain 1-worker training with the same seed and global batch: its own (1-replica) sampler
    order, `global_batch` images per step. With the same seed and epoch, the N ranks' s-th
    batches together hold exactly the images of this s-th batch (in another order), so DDP must
    end with these weights up to float rounding."""
    images, labels = synthetic_images(settings["count"], settings["image_size"], settings["num_classes"],
                                      settings["seed"])
    batches = rank_batches(settings["count"], 1, 0, settings["global_batch"], settings["seed"])[:settings["steps"]]
    torch.manual_seed(settings["seed"])
    model = small_cnn(settings["num_classes"], batchnorm=settings.get("batchnorm", False))
    sgd_steps(model, images, labels, batches, settings["lr"])
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _equivalence_worker(config, rank: int, world_size: int, steps: int, out: Path) -> dict:
    settings = equivalence_settings(config, steps)
    if settings["global_batch"] % world_size:
        raise ConfigError(f"batch_size={config.batch_size} (the global batch here) must divide by {world_size} workers")
    images, labels = synthetic_images(settings["count"], settings["image_size"], settings["num_classes"],
                                      settings["seed"])
    torch.manual_seed(settings["seed"])  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = small_cnn(settings["num_classes"], batchnorm=settings["batchnorm"])
    if settings["batchnorm"]:  # sync_batchnorm: what the engine does under DDP (`engine.sync_batchnorm`)
        from course_lib.engine import sync_batchnorm

        model = sync_batchnorm.convert(model, torch.device("cpu"))
    model = torch.nn.parallel.DistributedDataParallel(model)
    batches = rank_batches(settings["count"], world_size, rank, settings["global_batch"] // world_size,
                           settings["seed"])[:steps]
    sgd_steps(model, images, labels, batches, settings["lr"])
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(model.module.state_dict(), out / "ddp_weights.pt")
    return {"settings": settings, "weights_path": str(out / "ddp_weights.pt"),
            "seen_images": len(batches) * len(batches[0])}


def communication_events(profiler) -> dict:
    """Sum the durations of the profiler's all-reduce events. On CPU the backend's own span
    (`gloo:all_reduce`, from enqueue to completion) is used, not the enclosing `c10d::allreduce_`
    (counting both would count the same time twice); on GPUs the NCCL kernels' device time."""
    spans: dict[str, float] = {}
    device_us = 0.0
    for event in profiler.events():
        name = event.name
        lowered = name.lower()
        if not any(key in lowered for key in COMMUNICATION_NAMES):
            continue
        if "cuda" in str(getattr(event, "device_type", "")).lower():
            device_us += getattr(event, "device_time_total", 0.0)
        else:
            spans[name] = spans.get(name, 0.0) + event.cpu_time_total
    backend_spans = {name: us for name, us in spans.items() if re.match(r"(gloo|nccl|mpi|ucc):", name.lower())}
    chosen = backend_spans or spans
    return {"cpu_seconds": sum(chosen.values()) / 1e6, "device_seconds": device_us / 1e6,
            "event_names": sorted(chosen)}


def _scaling_worker(config, rank: int, world_size: int, device: torch.device, steps: int, warmup: int,
                    profile_steps: int, worker_counts: list[int], global_batch: int) -> dict:
    from course_lib.engine import auto_precision
    from course_lib.models.factory import build_model

    # A gloo group for waiting: ranks outside the measured group block in a TCP read (no CPU, no GPU).
    coordination = dist.new_group(backend="gloo")
    # new_group must be called by every rank, in the same order, members or not.
    groups = {n: dist.new_group(list(range(n))) for n in worker_counts if n > 1}
    torch.manual_seed(config.seed)
    raw_model = build_model(config, num_classes=8).to(
        device, memory_format=torch.channels_last if config.channels_last else torch.preserve_format)
    raw_model.train()
    precision = auto_precision.resolve(config.precision, raw_model, config.image_size, 8, device,
                                       batch_size=config.batch_size, channels_last=config.channels_last)
    # The step harness: a fresh copy per world size, with its own optimizer and scaler, on this rank's
    # random batches (seeded per rank, as DDP's shards differ).
    bench = StepBench(raw_model, config.image_size, config.batch_size, device, 8, seed=config.seed + rank)

    rows, communication = [], None
    for n in worker_counts:
        if rank < n:
            # A fresh copy per world size: DDP hooks the parameters it wraps, and a previous wrapper's
            # hooks must not fire into another group's all-reduce.
            wrap = None if n == 1 else (lambda replica, group=groups[n]: torch.nn.parallel.DistributedDataParallel(
                replica, device_ids=[device.index] if device.type == "cuda" else None, process_group=group))
            timed = bench.variant(precision, config.channels_last, wrap=wrap)
            measured: dict[int, list[float]] = {}  # per-worker batch -> step times (strong and weak can coincide)
            for mode, per_worker in (("strong", global_batch // n), ("weak", config.batch_size)):
                if per_worker < 1:
                    continue
                if per_worker not in measured:
                    measured[per_worker] = timed.redraw(per_worker).time(repeats=steps, warmup=warmup).seconds
                times = measured[per_worker]
                rows.append({"mode": mode, "workers": n, "per_worker_batch": per_worker,
                             "global_batch": per_worker * n, "step_seconds": statistics.median(times),
                             "step_seconds_all": times})
            if n == max(worker_counts) and n > 1:
                communication = _communication_share(timed.redraw(config.batch_size), steps, warmup, profile_steps,
                                                     with_sync=measured.get(config.batch_size))
            del timed
            gc.collect()
        dist.barrier(group=coordination)
    return {"rows": rows, "communication": communication, "precision": precision, "device": str(device),
            "parameters": sum(p.numel() for p in raw_model.parameters())}


def _communication_share(timed: TimedStep, steps, warmup, profile_steps, with_sync: list[float] | None = None) -> dict:
    """Two views of the all-reduce's cost at the largest world size (`timed` wraps its model in DDP):
    - profiled: time inside all-reduce events / step time (torch.profiler); on CPU/gloo the
      all-reduce runs on gloo's threads while backward continues, so this counts overlapped time;
    - exposed: 1 - (step time without all-reduce, under no_sync) / (step time with it): the part
      of the step that communication adds, which is what scaling efficiency loses."""
    from torch.profiler import ProfilerActivity, profile

    device = timed.device
    with_sync = statistics.median(with_sync or timed.time(repeats=steps, warmup=warmup).seconds)
    without_sync = timed.time(repeats=steps, warmup=warmup, sync_gradients=False).median
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        timed.time(repeats=profile_steps, warmup=0)
        profiled_seconds = time.perf_counter() - started
    events = communication_events(profiler)
    communication_seconds = events["device_seconds"] if device.type == "cuda" else events["cpu_seconds"]
    return {
        "step_seconds": with_sync, "no_sync_step_seconds": without_sync,
        "exposed_share": max(0.0, 1.0 - without_sync / with_sync),
        "profiled_share": communication_seconds / profiled_seconds if profiled_seconds else 0.0,
        "profiled_steps": profile_steps, "allreduce_seconds_per_step": communication_seconds / profile_steps,
        "event_names": events["event_names"],
        "gradient_bytes": sum(p.numel() * p.element_size() for p in timed.model.parameters() if p.requires_grad),
    }


@record  # writes the exception to torchrun's error file, so its summary names the rank that failed first
def run(task: str, config, *, steps: int = 5, warmup: int = 2, profile_steps: int = 3, global_batch: int = 0,
        out: str = "", max_bytes: int = 0) -> None:
    """One worker of the probe (`workbook ddp-probe`, started by torchrun): "scaling" times steps for
    1..world-size workers, "equivalence" trains a few SGD steps for the DDP == one-process check,
    "bandwidth" times all-reduces of 1 KiB to `max_bytes` (0: 256 MiB; `engine.allreduce`, `steps` timed
    each), "fail" raises on purpose (to test failure reports). Rank 0 writes one ledger row."""
    if task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {', '.join(TASKS)}")
    world_size, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    # The equivalence check is about arithmetic, so it runs on CPU with gloo everywhere.
    if task in ("scaling", "bandwidth") and config.device != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    started = time.perf_counter()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    # An error below leaves the group to the process's exit, after its error file and stderr: destroying it first
    # tells the peers, and torchrun, seeing a peer's "connection closed" end first, stops this rank and blames the peer.
    fail_rank = os.environ.get(FAIL_RANK_ENV)
    if task == "fail" or (fail_rank not in (None, "") and int(fail_rank) == rank):
        raise RuntimeError(f"deliberate failure on rank {rank} ({FAIL_RANK_ENV}={fail_rank}, task={task})")
    if task == "equivalence":
        result = _equivalence_worker(config, rank, world_size, steps, Path(out or "runs/ddp_probe"))
    elif task == "bandwidth":
        from course_lib.engine import allreduce

        result = allreduce.worker(world_size, device, max_bytes or allreduce.SIZES[-1], steps, warmup)
    else:
        worker_counts = list(range(1, world_size + 1))
        result = _scaling_worker(config, rank, world_size, device, steps, warmup, profile_steps, worker_counts,
                                 global_batch or config.batch_size * world_size)
    if rank == 0:
        print(f"ddp_probe {task}: {world_size} worker(s) done in {time.perf_counter() - started:.1f} s", flush=True)
        ledger.record("ddp", task, duration_seconds=time.perf_counter() - started,
                      parameters={**config.to_dict(), "world_size": world_size, "steps": steps, "warmup": warmup},
                      metrics={"world_size": world_size, **json.loads(json.dumps(result, default=str))})
    # Leave together: a rank that tears down its process group while a peer (here rank 0, still
    # writing the ledger) is connected can abort at exit ("terminate called without an active exception").
    # Collect first: a DDP reducer in a reference cycle keeps the gloo group alive into interpreter teardown (that abort).
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
