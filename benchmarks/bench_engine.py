"""Engine overhead and model-FLOPs utilization (issue 5).

The engine (`course_lib.engine.train.fit`) against a minimal hand-written loop doing the same work
(same model, data, optimizer, schedule and precision; forward, loss, backward, step), side by
side in one run, alternating, with a thrown-away warm-up epoch each. Target: overhead <= 3 %.
MFU: training FLOPs per image (`torch.utils.flop_counter`) x images/s over the matmul peak
that `course_lib.measure.peak` measures.

    .venv/bin/python benchmarks/bench_engine.py            # about two minutes on 2 CPU cores
    .venv/bin/python benchmarks/bench_engine.py --quick    # seconds, to check it runs
    .venv/bin/python benchmarks/bench_engine.py --profile gpu -p model=resnet50 -p precision=bf16

Writes benchmarks/results/engine.json and engine.md (hardware named). On a shared machine
compare the ratio, not the absolute numbers.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _shared import argument_parser, write  # noqa: E402
from course_lib import devices, ledger, machine
from course_lib.config import make_config, parse_assignments  # noqa: E402
from course_lib.data.datasets import DataBundle  # noqa: E402
from course_lib.data.loaders import make_loader  # noqa: E402
from course_lib.engine import train
from course_lib.engine.precision import DTYPES, autocast, grad_scaler, resolve_precision  # noqa: E402
from course_lib.engine.schedule import make_optimizer, make_scheduler  # noqa: E402
from course_lib.measure import flops
from course_lib.models import factory  # noqa: E402

CLASSES = [str(i) for i in range(10)]


class InMemoryImages(torch.utils.data.Dataset):
    """Normalized random images held in memory, so data loading costs the same in both loops
    and the comparison isolates the engine's own overhead."""

    def __init__(self, count: int, image_size: int):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(count, 3, image_size, image_size, generator=generator)
        self.targets = torch.randint(0, len(CLASSES), (count,), generator=generator)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], int(self.targets[index])


def hand_written_loop(config, bundle, device, precision) -> dict:
    """The loop a reader would write in ten lines; images/s of its second (warm) epoch, by the wall
    clock and per second of this process's CPU time."""
    train.seed_everything(config.seed)
    model = factory.build_model(config, len(bundle.classes)).to(
        device, memory_format=torch.channels_last if config.channels_last else torch.preserve_format)
    optimizer = make_optimizer(model, config)
    scheduler = make_scheduler(optimizer, config, config.max_steps)
    scaler = grad_scaler(precision, device)
    loader = make_loader(bundle.train, config, train=True)
    model.train()
    for _epoch in range(2):  # the first epoch is the warm-up, thrown away
        started, cpu_started, images_seen = time.perf_counter(), time.process_time(), 0
        for step, (images, targets) in enumerate(loader):
            if step == config.max_steps:
                break
            images = bundle.device_stage(images, device, train=True)  # the copy, as the engine makes it
            if config.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            targets = targets.to(device, non_blocking=True)
            with autocast(precision, device):
                loss = F.cross_entropy(model(images), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            images_seen += len(targets)
        loss.item()  # the engine reads its losses at the end of the epoch: same sync here
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {"wall": images_seen / wall, "cpu": images_seen / cpu}


def engine_loop(config, bundle) -> dict:
    last = train.fit(config, bundle=bundle, progress=False, verbose=False).history[-1]  # the second epoch: warm
    images = last["images_per_second"] * last["epoch_seconds"]
    return {"wall": last["images_per_second"], "cpu": images / last["process_cpu_seconds"]}


def main(argv=None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="engine/hand pairs, alternating")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: 1 on CPU, so a shared machine's time-slicing "
                             "does not stall OpenMP barriers; 0 = torch's default)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args(argv)

    defaults = dict(model="resnet18", image_size=32, batch_size=32, max_steps=12, num_workers=0,
                    channels_last=True, precision="auto")
    if args.quick:
        defaults.update(model="test_resnet", max_steps=3)
        args.repeats = 2
    overrides = {**defaults, **parse_assignments(args.param)}
    workdir = Path(tempfile.mkdtemp(prefix="bench_engine_"))
    config = make_config(args.profile, **overrides, epochs=2, output_dir=str(workdir / "checkpoints"))
    device = devices.resolve_device(config.device)
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    precision = resolve_precision(config.precision, device)
    config = config.replace(precision=precision)
    images = config.batch_size * config.max_steps
    bundle = DataBundle(InMemoryImages(images, config.image_size), None, None, CLASSES, "random tensors in memory")

    # The engine's own ledger rows go to a scratch ledger; this benchmark records one row below.
    real_ledger = ledger.default_path()
    os.environ[ledger.LEDGER_ENV] = str(workdir / "scratch.sqlite")
    hardware_line = machine.describe_hardware()
    load_before = os.getloadavg()[0]
    print(f"engine vs hand-written loop: {config.model} {config.image_size}px batch {config.batch_size} "
          f"x {config.max_steps} steps, precision {precision}, channels_last {config.channels_last}, "
          f"device {device}, {torch.get_num_threads()} CPU thread(s); {hardware_line}; load average {load_before:.1f}",
          flush=True)
    pairs = []
    for repeat in range(args.repeats):
        # Alternate which goes first, so a slow phase of a shared machine hits both alike.
        order = ("engine", "hand") if repeat % 2 == 0 else ("hand", "engine")
        measured = {}
        for name in order:
            measured[name] = engine_loop(config, bundle) if name == "engine" else \
                hand_written_loop(config, bundle, device, precision)
        pairs.append(measured)
        print(f"  repeat {repeat + 1}: images/s engine {measured['engine']['wall']:.1f} vs hand "
              f"{measured['hand']['wall']:.1f} (wall), engine {measured['engine']['cpu']:.1f} vs hand "
              f"{measured['hand']['cpu']:.1f} (per CPU second)", flush=True)
    os.environ[ledger.LEDGER_ENV] = str(real_ledger)

    def median(loop, clock):
        return statistics.median(p[loop][clock] for p in pairs)

    def median_ratio(clock):
        return statistics.median(p["engine"][clock] / p["hand"][clock] for p in pairs)

    # On a GPU the wall clock is the measure. On a shared CPU, other jobs take cores at random
    # moments; CPU time counts only the moments this process ran, so it compares the work done.
    clock = "wall" if device.type == "cuda" else "cpu"
    ratio = median_ratio(clock)
    overhead = 1 - ratio
    engine_rate = median("engine", "wall")
    model = factory.build_model(config, len(CLASSES))
    flops_per_image = flops.training_flops_per_image(model, config.image_size)
    utilization = flops.model_flops_utilization(flops_per_image, engine_rate, device,
                                                DTYPES[precision] if precision != "off" else torch.float32)
    summary = {
        "engine_images_per_second": engine_rate, "hand_images_per_second": median("hand", "wall"),
        "engine_images_per_cpu_second": median("engine", "cpu"), "hand_images_per_cpu_second": median("hand", "cpu"),
        "wall_ratio": median_ratio("wall"), "cpu_time_ratio": median_ratio("cpu"), "overhead_clock": clock,
        "overhead_fraction": overhead, "overhead_within_3_percent": overhead <= 0.03,
        "training_flops_per_image": flops_per_image, **utilization,
        "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
    }
    parameters = {"model": config.model, "image_size": config.image_size, "batch_size": config.batch_size,
                  "steps_timed": config.max_steps, "repeats": args.repeats, "precision": precision,
                  "channels_last": config.channels_last, "device": str(device), "profile": args.profile,
                  "threads": torch.get_num_threads()}
    ledger.record("bench", "engine", parameters=parameters, metrics=summary)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    write(out / f"engine{suffix}.json", json.dumps(
        {"hardware": hardware_line, "versions": machine.runtime_versions(), "parameters": parameters,
         "pairs": pairs, "summary": summary, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        indent=2, default=str))
    mfu = f"{utilization['mfu']:.1%}" if utilization["mfu"] is not None else "n/a"
    peak = f"{utilization['peak_flops'] / 1e9:.1f} GFLOP/s" if utilization["peak_flops"] else "n/a"
    table = "\n".join([
        "# Engine overhead and MFU\n",
        f"Hardware: {hardware_line}. torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s). "
        f"Load average {load_before:.1f} before, {summary['load_average_after']:.1f} after: the machine is shared "
        "with other jobs, so the overhead is judged on " + ("the wall clock." if clock == "wall" else
                                                            "images per CPU-second of this process.") + "\n",
        f"Workload: {config.model}, {config.image_size} px, batch {config.batch_size}, {config.max_steps} timed steps "
        f"after a warm-up epoch, precision {precision}, channels_last {config.channels_last}, "
        f"in-memory data, {args.repeats} alternating repeats (medians).\n",
        "| loop | images/s (wall) | images per CPU-second |", "|---|---:|---:|",
        f"| hand-written (forward, loss, backward, step) | {median('hand', 'wall'):.1f} | {median('hand', 'cpu'):.1f} |",
        f"| engine `train.fit` | {engine_rate:.1f} | {median('engine', 'cpu'):.1f} |",
        f"| engine / hand (median of paired ratios) | {summary['wall_ratio']:.3f} | {summary['cpu_time_ratio']:.3f} |",
        "",
        f"Engine overhead ({'wall clock' if clock == 'wall' else 'CPU time'}): {overhead:+.1%} "
        f"(target <= 3%: {'met' if overhead <= 0.03 else 'NOT met'}).", "",
        f"Model FLOPs utilization: {flops_per_image / 1e9:.3f} GFLOP per training image x {engine_rate:.1f} images/s "
        f"= {utilization['achieved_flops'] / 1e9:.1f} GFLOP/s against a peak of {peak} "
        f"({utilization['peak_source']}, at the same thread count): MFU {mfu}.",
    ])
    write(out / f"engine{suffix}.md", table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
