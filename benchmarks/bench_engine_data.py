"""The engine's speed with each data pipeline switch (issue 10), on real EuroSAT tiles.

For every storage x decoder x augmentation setting, `workbook train`'s engine (`train.fit`) runs
two short epochs on `../shared/datasets/eurosat_rgb` (the first warms up the workers and caches and
is thrown away) and the second epoch's images/s and data-wait share are recorded, next to two
ceilings measured in the same run: the compute-only ceiling (the same model, training steps on
a batch already in memory, no loader at all) and the engine on tensors already in memory. MFU is
against the measured fp32 (or chosen precision's) matmul peak. Settings run in an interleaved
order, twice, and the median is kept, so a slow phase of a shared machine hits all alike.

    .venv/bin/python benchmarks/bench_engine_data.py           # about 8 minutes on 2 CPU cores
    .venv/bin/python benchmarks/bench_engine_data.py --quick   # a minute, to check it runs

Target: with storage=cache the data wait is under 5% of the step and images/s within 5% of the
compute-only ceiling. Writes benchmarks/results/engine_data.json and engine_data.md (hardware and
load average named). Skips, saying why, when the EuroSAT folder is absent.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _shared import argument_parser, eurosat_or_skip, write  # noqa: E402
from course_lib import devices, ledger, machine  # noqa: E402
from course_lib.config import make_config, parse_assignments  # noqa: E402
from course_lib.data import datasets, pipeline  # noqa: E402
from course_lib.engine import auto_precision, train  # noqa: E402
from course_lib.engine.label_smoothing import make_criterion  # noqa: E402
from course_lib.engine.precision import DTYPES, grad_scaler  # noqa: E402
from course_lib.engine.schedule import make_optimizer  # noqa: E402
from course_lib.engine.step import optimizer_step, training_step  # noqa: E402
from course_lib.measure import flops  # noqa: E402
from course_lib.instruments.timing import time_repeats  # noqa: E402
from course_lib.models import factory  # noqa: E402

# (storage, decoder, augmentation, num_workers): every decoder on loose files, the cache and the
# shards with the default decoder (the cache decodes once, at build time), every augmentation
# place; -1 = the recommended workers. The cache also without workers: its batches are slices of
# an array in memory, and on 2 cores a worker process competes with the training threads.
SETTINGS = [
    ("files", "pil", "cpu", -1), ("files", "opencv", "cpu", -1), ("files", "torchvision", "cpu", -1),
    ("files", "pil", "device", -1), ("files", "pil", "none", -1),
    ("cache", "pil", "cpu", -1), ("cache", "pil", "device", -1), ("cache", "pil", "none", -1),
    ("cache", "pil", "device", 0), ("cache", "pil", "none", 0),
    ("shards", "pil", "cpu", -1), ("shards", "opencv", "device", -1),
]
TARGET_WAIT, TARGET_CEILING = 0.05, 0.95


class MemoryImages(torch.utils.data.Dataset):
    """Normalised float images already in memory: the loader only indexes and collates."""

    def __init__(self, count: int, image_size: int, classes: int):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(count, 3, image_size, image_size, generator=generator)
        self.targets = torch.randint(classes, (count,), generator=generator)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], int(self.targets[index])


def compute_ceiling(config, classes: int, device, steps: int) -> float:
    """Images/s of training steps on one batch already on the device: no loader, no engine."""
    torch.manual_seed(config.seed)
    model = factory.build_model(config, classes).to(
        device, memory_format=torch.channels_last if config.channels_last else torch.preserve_format).train()
    optimizer, scaler = make_optimizer(model, config), grad_scaler(config.precision, device)
    criterion = make_criterion(config)
    memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
    images = torch.randn(config.batch_size, 3, config.image_size, config.image_size, device=device)
    images = images.contiguous(memory_format=memory_format)
    targets = torch.randint(classes, (config.batch_size,), device=device)

    def step():
        training_step(model, images, targets, criterion, scaler, config.precision)
        optimizer_step(optimizer, scaler)

    timing = time_repeats(step, repeats=3, warmup=2, device=device, calls=max(1, steps // 3))
    return timing.per_second(config.batch_size)


def engine_epoch(config, bundle) -> dict:
    """The second of two epochs of the engine on `bundle` (no validation): images/s, data wait."""
    result = train.fit(config, bundle=bundle, progress=False, verbose=False)
    row = result.history[-1]
    return {"images_per_second": row["images_per_second"], "data_wait_fraction": row["data_wait_fraction"],
            "epoch_seconds": row["epoch_seconds"]}


def markdown(results: dict) -> str:
    s = results["summary"]
    lines = [
        "# Engine images/s per data pipeline setting (EuroSAT, 64 px)\n",
        f"Hardware: **{results['hardware']}**; load average {results['load_average_before']:.1f} before, "
        f"{results['load_average_after']:.1f} after; {results['parameters']['model']}, batch "
        f"{results['parameters']['batch_size']}, precision {results['parameters']['precision']}, "
        f"channels_last {results['parameters']['channels_last']}, num_workers {results['parameters']['num_workers']}, "
        f"{results['parameters']['steps']} timed steps per run, median of {results['parameters']['repeats']} "
        f"interleaved runs; measured {results['started']}.\n",
        f"Compute-only ceiling (training steps on a batch in memory): **{s['compute_ceiling']:.1f} images/s**, "
        f"MFU {s['ceiling_mfu']:.1%} of the {s['peak_source']} peak. Engine on tensors in memory: "
        f"{s['engine_memory']['images_per_second']:.1f} images/s (data wait {s['engine_memory']['data_wait_fraction']:.1%}).\n",
        "| storage | decoder | augmentation | workers | images/s | of ceiling | data wait | MFU | build s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(f"| {row['storage']} | {row['decoder']} | {row['augmentation']} | {row['num_workers']} | "
                     f"{row['images_per_second']:.1f} | "
                     f"{row['of_ceiling']:.1%} | {row['data_wait_fraction']:.1%} | {row['mfu']:.1%} | "
                     f"{row['build_seconds']:.1f} |")
    lines += ["", "Targets (storage=cache): data wait < 5% of the step, images/s >= 95% of the compute-only "
              "ceiling.", ""]
    for row in results["rows"]:
        if row["storage"] == "cache":
            wait_ok, speed_ok = row["data_wait_fraction"] < TARGET_WAIT, row["of_ceiling"] >= TARGET_CEILING
            lines.append(f"- cache, augmentation {row['augmentation']}, {row['num_workers']} worker(s): data wait "
                         f"{row['data_wait_fraction']:.1%} "
                         f"({'met' if wait_ok else 'missed'}), {row['of_ceiling']:.1%} of the ceiling "
                         f"({'met' if speed_ok else 'missed by ' + format(TARGET_CEILING - row['of_ceiling'], '.1%')})")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per epoch")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved runs per setting (median kept)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args(argv)

    eurosat = eurosat_or_skip("this benchmark measures real JPEG tiles")
    if eurosat is None:
        return 0
    # persistent_workers: the timed second epoch measures the pipeline, not the workers' start-up.
    defaults = dict(model="resnet18", image_size=64, batch_size=64, num_workers=-1, channels_last=True,
                    precision="auto", persistent_workers=True)
    if args.quick:
        defaults.update(model="test_resnet", batch_size=16)
        args.steps, args.repeats = 3, 1
    overrides = {**defaults, **parse_assignments(args.param)}
    workdir = Path(tempfile.mkdtemp(prefix="bench_engine_data_"))
    base = make_config(args.profile, dataset="imagefolder", data_dir=str(eurosat), epochs=2, max_steps=args.steps,
                       max_train_images=args.steps * overrides["batch_size"] * 2, output_dir=str(workdir / "ckpt"),
                       **overrides)
    device = devices.resolve_device(base.device)
    classes = 10
    probe_model = factory.build_model(base, classes).to(
        device, memory_format=torch.channels_last if base.channels_last else torch.preserve_format)
    precision = auto_precision.resolve(base.precision, probe_model, base.image_size, classes, device,
                                       batch_size=base.batch_size, channels_last=base.channels_last, log=print)
    base = base.replace(precision=precision)  # every run trains in the same, measured precision
    real_ledger = ledger.default_path()
    os.environ[ledger.LEDGER_ENV] = str(workdir / "scratch.sqlite")  # the engine's rows: scratch
    hardware = machine.describe_hardware()
    load_before = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M")
    print(f"engine x data pipeline on {eurosat}: {base.model} {base.image_size}px batch {base.batch_size}, "
          f"precision {precision}, workers {devices.resolve_num_workers(base.num_workers)}; {hardware}; "
          f"load average {load_before:.1f}", flush=True)

    bundles, build_seconds = {}, {}
    for key in SETTINGS:  # builds (and caches) are not part of the timing
        storage, decoder, augmentation, workers = key
        config = base.replace(storage=storage, decoder=decoder, augmentation=augmentation, num_workers=workers)
        start = time.perf_counter()
        bundle = pipeline.build_datasets(config)
        build_seconds[key] = time.perf_counter() - start
        bundles[key] = (config, dataclasses.replace(bundle, val=None, test=None))
    memory_bundle = datasets.DataBundle(MemoryImages(len(bundles[SETTINGS[0]][1].train), base.image_size, classes),
                                        None, None, [str(i) for i in range(classes)], "tensors in memory")

    measured = {key: [] for key in [*SETTINGS, "memory"]}
    ceilings = []
    for repeat in range(args.repeats):
        ceilings.append(compute_ceiling(base, classes, device, args.steps))
        order = [*SETTINGS, "memory"] if repeat % 2 == 0 else ["memory", *reversed(SETTINGS)]
        for key in order:
            config, bundle = (base.replace(num_workers=0), memory_bundle) if key == "memory" else bundles[key]
            measured[key].append(engine_epoch(config, bundle))
            last = measured[key][-1]
            print(f"  {key}: {last['images_per_second']:.1f} images/s, data wait {last['data_wait_fraction']:.1%}",
                  flush=True)
        print(f"  compute-only ceiling: {ceilings[-1]:.1f} images/s", flush=True)

    ceiling = statistics.median(ceilings)
    flops_per_image = flops.training_flops_per_image(factory.build_model(base, classes), base.image_size)
    dtype = DTYPES[precision] if precision != "off" else torch.float32

    def median_of(key, name):
        return statistics.median(run[name] for run in measured[key])

    rows = []
    for key in SETTINGS:
        rate = median_of(key, "images_per_second")
        utilization = flops.model_flops_utilization(flops_per_image, rate, device, dtype)
        rows.append({"storage": key[0], "decoder": key[1], "augmentation": key[2],
                     "num_workers": devices.resolve_num_workers(key[3]), "images_per_second": rate,
                     "data_wait_fraction": median_of(key, "data_wait_fraction"), "of_ceiling": rate / ceiling,
                     "mfu": utilization["mfu"] or 0.0, "build_seconds": build_seconds[key]})
    ceiling_utilization = flops.model_flops_utilization(flops_per_image, ceiling, device, dtype)
    summary = {"compute_ceiling": ceiling, "ceiling_mfu": ceiling_utilization["mfu"] or 0.0,
               "peak_source": ceiling_utilization["peak_source"], "training_flops_per_image": flops_per_image,
               "engine_memory": {"images_per_second": median_of("memory", "images_per_second"),
                                 "data_wait_fraction": median_of("memory", "data_wait_fraction")}}
    for row in rows:
        if row["storage"] == "cache":
            name = f"cache_{row['augmentation']}_{row['num_workers']}workers"
            summary[f"{name}_wait_met"] = row["data_wait_fraction"] < TARGET_WAIT
            summary[f"{name}_ceiling_met"] = row["of_ceiling"] >= TARGET_CEILING
    parameters = {"model": base.model, "image_size": base.image_size, "batch_size": base.batch_size,
                  "precision": precision, "channels_last": base.channels_last, "steps": args.steps,
                  "repeats": args.repeats, "num_workers": devices.resolve_num_workers(base.num_workers),
                  "device": str(device), "profile": args.profile, "data": str(eurosat)}
    results = {"hardware": hardware, "started": started, "parameters": parameters, "summary": summary, "rows": rows,
               "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
               "versions": machine.runtime_versions(), "quick": args.quick}
    os.environ[ledger.LEDGER_ENV] = str(real_ledger)  # this benchmark's own row goes to the real ledger
    ledger.record("bench", "engine_data", parameters=parameters,
                  metrics={k: v for k, v in summary.items() if isinstance(v, (int, float, bool))})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "engine_data_quick" if args.quick else "engine_data"
    write(out / f"{name}.json", json.dumps(results, indent=2, default=str))
    write(out / f"{name}.md", markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
