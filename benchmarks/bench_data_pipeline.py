"""Data-pipeline benchmark (issue 4): decoders, DataLoader sweep, pre-decoded cache, tar shards,
device-side augmentation and data wait, on the real 64 px EuroSAT folder and 512 px landcover-synth.

    .venv/bin/python benchmarks/bench_data_pipeline.py            # a few minutes on 2 cores
    .venv/bin/python benchmarks/bench_data_pipeline.py --quick    # seconds, to check it runs

Writes benchmarks/results/data_pipeline.json and data_pipeline.md (with the hardware named).
Measurements are side by side in one run: on a shared machine compare ratios, not absolutes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import ROOT, write  # noqa: E402 (puts the project on sys.path)

from course_lib import devices, machine, paths  # noqa: E402
from course_lib.config import make_config  # noqa: E402
from course_lib.data import (
    cache,
    datasets,
    decode,
    device_augment,
    landcover,
    loaders,
    shards,
    transforms,
)
from course_lib.engine.precision import grad_scaler  # noqa: E402
from course_lib.engine.step import optimizer_step, training_step  # noqa: E402
from course_lib.measure import bench, disk, loader_sweep  # noqa: E402


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def decode_section(eurosat: Path, land512: Path, quick: bool) -> list[dict]:
    repeats = 2 if quick else 5
    rows = []
    for label, folder, count in ((f"EuroSAT files ({eurosat.name})", eurosat, 64 if quick else 512),
                                 ("landcover-synth 512 px files", land512, 16 if quick else 64)):
        blobs = [path.read_bytes() for path in decode.image_files(folder, count)]
        rows += bench.benchmark_decoders(blobs, repeats=repeats, label=label)
    for size in (256, 1024):
        count = 8 if quick else bench.images_for_size(size)
        rows += bench.benchmark_decoders(decode.jpeg_samples(size, count), repeats=repeats,
                                          label=f"generated {size} px JPEGs")
    return rows


def sweep_section(label: str, folder: Path, image_size: int, images: int, grid: dict, base, quick: bool) -> dict:
    dataset = loaders.first_images(loaders.image_folder_dataset(folder, image_size, augmentation="cpu"), images)
    config = base.replace(image_size=image_size)
    settings = loader_sweep.setting_grid(**grid)
    rows = loader_sweep.sweep_loader(dataset, config, settings, epochs=1 if quick else 2,
                                device=devices.transfer_device(config.device),
                                on_result=lambda r: log(f"  {label} {r['setting']}: {r['images_per_second']:.0f}/s"))
    knee, best = loader_sweep.find_knee(rows), max(rows, key=lambda r: r["images_per_second"])
    one_core = loader_sweep.single_process_rate(dataset, images=min(images, 64 if quick else 256))
    cores = devices.usable_cores()
    return {"label": label, "folder": str(folder), "image_size": image_size, "images": len(dataset),
            "pipeline": "PIL decode + RandomResizedCrop + flip + ColorJitter per sample in workers",
            "rows": rows, "knee": knee["setting"], "knee_images_per_second": knee["images_per_second"],
            "best": best["setting"], "best_images_per_second": best["images_per_second"],
            "single_process_images_per_second": one_core["images_per_second"], "usable_cores": cores,
            "fraction_of_single_rate_times_cores": best["images_per_second"] / (one_core["images_per_second"] * cores)}


def cache_section(label: str, folder: Path, image_size: int, cpu_images: int, base, quick: bool,
                  max_images: int = 0) -> dict:
    info = cache.build_cache(folder, image_size, num_workers=2, max_images=512 if quick else max_images)
    log(f"  cache {label}: {info.images} images, {info.pixel_bytes / 1e6:.0f} MB "
        f"({info.disk_ratio:.1f}x the JPEGs), built in {info.build_seconds:.1f} s")
    jpeg = loaders.image_folder_dataset(folder, image_size, augmentation="device")
    cached = cache.PreDecodedDataset(info.folder)
    if info.images < len(jpeg):  # same images on both paths
        jpeg = torch.utils.data.Subset(jpeg, [int(i * len(jpeg) / info.images) for i in range(info.images)])
    epochs = 1 if quick else 2
    rows = []
    for workers in (0, 2):
        config = base.replace(image_size=image_size, num_workers=workers)
        for path, dataset in (("JPEG files", jpeg), ("pre-decoded memmap", cached)):
            row = loader_sweep.time_dataset(dataset, config, epochs=epochs)
            rows.append({"path": path, "augmentation": "none (uint8 batches: the loader alone)", **row})
            log(f"  {label} {path} workers={workers}: {row['images_per_second']:.0f}/s")
        cpu_transform = transforms.sample_transform(image_size, "cpu")
        for path, dataset in (("JPEG files", loaders.image_folder_dataset(folder, image_size, augmentation="cpu")),
                              ("pre-decoded memmap", cache.PreDecodedDataset(info.folder, cpu_transform))):
            row = loader_sweep.time_dataset(loaders.first_images(dataset, cpu_images), config, epochs=epochs)
            rows.append({"path": path, "augmentation": "per-sample CPU (crop, flip, jitter)", **row})
            log(f"  {label} {path} + CPU augmentation workers={workers}: {row['images_per_second']:.0f}/s")
    speedups = {}
    for augmentation in {r["augmentation"] for r in rows}:
        for workers in (0, 2):
            pair = {r["path"]: r["images_per_second"] for r in rows
                    if r["augmentation"] == augmentation and r["num_workers"] == workers}
            speedups[f"{augmentation} | workers={workers}"] = pair["pre-decoded memmap"] / pair["JPEG files"]
        best = {path: max(r["images_per_second"] for r in rows if r["augmentation"] == augmentation
                          and r["path"] == path) for path in ("JPEG files", "pre-decoded memmap")}
        speedups[f"{augmentation} | each at its best workers"] = best["pre-decoded memmap"] / best["JPEG files"]
    return {"label": label, "images": info.images, "image_size": image_size, "pixel_bytes": info.pixel_bytes,
            "jpeg_bytes": info.source_bytes, "disk_ratio": info.disk_ratio, "build_seconds": info.build_seconds,
            "rows": rows, "speedups": speedups}


def shards_section(folder: Path, images: int, base, quick: bool) -> dict:
    out = ROOT / "data_cache" / "shards" / f"{folder.parent.name}-{images}"
    shard_count = shards.recommend_shard_count(ranks=1, workers_per_rank=2, total_bytes=0) * 4  # 8 shards
    written = shards.write_shards(folder, out, shard_count, max_images=images)
    files = [path for path, _ in datasets.ImageFolderDataset(folder).samples]
    files = [files[int(i * len(files) / images)] for i in range(images)]
    raw = disk.time_raw_reads(files, written.urls, repeats=2 if quick else 3)
    log(f"  raw reads: loose {raw['loose_files_per_second']:.0f} files/s, "
        f"shards {raw['shards_files_per_second']:.0f} files/s")
    loose = loaders.image_folder_dataset(folder, 64, augmentation="device")
    loose = torch.utils.data.Subset(loose, [int(i * len(loose) / images) for i in range(images)])
    streamed = shards.ShardDataset(written.urls, transforms.sample_transform(64, "device"))
    rows = []
    for workers in (0, 2):
        config = base.replace(image_size=64, num_workers=workers)
        for path, dataset in (("loose files", loose), ("tar shards", streamed)):
            row = loader_sweep.time_dataset(dataset, config, epochs=1 if quick else 2)
            rows.append({"path": path, **row})
            log(f"  {path} workers={workers}: {row['images_per_second']:.0f}/s")
    return {"images": images, "shards": len(written.urls), "shard_bytes": written.shard_bytes,
            "write_seconds": written.write_seconds, "raw_reads": raw, "rows": rows,
            "advice_2_ranks_x_4_workers": shards.recommend_shard_count(2, 4, written.shard_bytes)}


def augment_section(folder: Path, images: int, base, quick: bool) -> dict:
    rows = []
    device = devices.transfer_device(base.device)
    batch_augment = device_augment.DeviceAugment(64, seed=0)
    for workers in (0, 2):
        config = base.replace(image_size=64, num_workers=workers)
        cpu = loaders.first_images(loaders.image_folder_dataset(folder, 64, augmentation="cpu"), images)
        batched = loaders.first_images(loaders.image_folder_dataset(folder, 64, augmentation="device"), images)
        for place, dataset, transform in (("per-sample, CPU workers (torchvision v2)", cpu, None),
                                          (f"per-batch on {device or 'cpu'} (DeviceAugment)", batched, batch_augment)):
            row = loader_sweep.time_dataset(dataset, config, epochs=1 if quick else 2, batch_transform=transform,
                                       device=device)
            rows.append({"augmentation": place, **row})
            log(f"  {place} workers={workers}: {row['images_per_second']:.0f}/s")
    return {"images": images, "rows": rows}


def data_wait_section(folder: Path, base, quick: bool) -> list[dict]:
    import timm

    device = devices.transfer_device(base.device) or torch.device("cpu")
    dataset = loaders.image_folder_dataset(folder, 64, augmentation="cpu")
    model = timm.create_model("resnet18", num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = grad_scaler("off", device)  # disabled: the fp32 step the engine runs with precision=off

    def step(batch):  # the engine's own step (engine/step.py), so the data wait is the engine's
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        training_step(model, images, labels, torch.nn.functional.cross_entropy, scaler)
        optimizer_step(optimizer, scaler)

    rows = []
    for workers in (0, 2):
        loader = loaders.make_loader(dataset, base.replace(num_workers=workers, batch_size=64), train=True)
        timer = loader_sweep.measure_data_wait(loader, step, max_batches=3 if quick else 8, device=device)
        rows.append({"num_workers": workers, "model": "resnet18", "batch_size": 64, **timer.summary()})
        log(f"  data wait workers={workers}: {timer.data_wait_fraction:.0%}")
    return rows


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------

def table(rows: list[dict], columns: list[str]) -> str:
    def cell(value):
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def markdown(results: dict) -> str:
    s = results["sections"]
    out = ["# Data pipeline benchmark (issue 4)\n",
           f"Hardware: **{results['hardware']}**; {results['usable_cores']} usable cores; "
           f"torch {results['versions'].get('torch')}, torchvision {results['versions'].get('torchvision')}.  ",
           f"Run {results['started']} -> {results['finished']} ({results['seconds']:.0f} s); load average before/after: "
           f"{results['load_before']} / {results['load_after']}.\n",
           f"> {results['note']}\n"]
    out += ["## Targets\n", table(results["targets"], ["target", "measured", "met"]), ""]
    out += ["## Decoders (in-memory bytes, one core, median of repeats)\n",
            table(s["decode"], ["inputs", "decoder", "image_size", "images", "images_per_second",
                                "megabytes_per_second", "speedup_vs_pil"]), ""]
    for sweep in s["sweeps"]:
        out += [f"## DataLoader sweep: {sweep['label']} ({sweep['images']} images, {sweep['pipeline']})\n",
                table(sweep["rows"], ["setting", "images_per_second"]), "",
                f"Knee (cheapest within 5% of best): **{sweep['knee']}** ({sweep['knee_images_per_second']:.0f}/s); "
                f"best {sweep['best']} ({sweep['best_images_per_second']:.0f}/s); one process "
                f"{sweep['single_process_images_per_second']:.0f}/s x {sweep['usable_cores']} cores -> fraction "
                f"**{sweep['fraction_of_single_rate_times_cores']:.2f}**.\n"]
    for item in s["cache"]:
        out += [f"## Pre-decoded cache: {item['label']} ({item['images']} images)\n",
                f"Disk: {item['pixel_bytes'] / 1e6:.0f} MB raw pixels vs {item['jpeg_bytes'] / 1e6:.1f} MB JPEG "
                f"(**{item['disk_ratio']:.1f}x**); built in {item['build_seconds']:.1f} s.\n",
                table(item["rows"], ["path", "augmentation", "num_workers", "images", "images_per_second"]), "",
                table([{"comparison": k.replace(" | ", "; "), "speed-up": v} for k, v in item["speedups"].items()],
                      ["comparison", "speed-up"]), ""]
    sh = s["shards"]
    out += [f"## Tar shards vs loose files ({sh['images']} EuroSAT images, {sh['shards']} shards)\n",
            f"Raw reads (no decoding, warm page cache): loose {sh['raw_reads']['loose_files_per_second']:,.0f} files/s, "
            f"shards {sh['raw_reads']['shards_files_per_second']:,.0f} files/s "
            f"(**{sh['raw_reads']['shards_speedup']:.2f}x**).\n",
            table(sh["rows"], ["path", "num_workers", "images", "images_per_second"]), "",
            f"Shard advice for 2 ranks x 4 workers: {sh['advice_2_ranks_x_4_workers']} shards "
            "(a multiple of 8 readers; fewer than 8 leaves readers empty and DDP hangs).\n"]
    out += [f"## Augmentation: per-sample CPU vs per-batch on the device ({s['augment']['images']} images)\n",
            table(s["augment"]["rows"], ["augmentation", "num_workers", "images_per_second"]), ""]
    out += ["## Data wait during training (resnet18, batch 64, 64 px)\n",
            table(s["data_wait"], ["num_workers", "batches", "data_wait_seconds", "step_seconds",
                                   "data_wait_fraction"]), ""]
    out += [f"## pin_memory\n\n{s['pin_memory']}\n"]
    out += ["## Threads pitfall (one process, per-sample CPU augmentation at 64 px)\n",
            table([{"torch threads": k, "images_per_second": v} for k, v in s["threads_pitfall"].items()],
                  ["torch threads", "images_per_second"]),
            "\nThe rest of this run uses 1 intra-op thread in the main process (workers always have 1).\n"]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: check that it runs")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="folder for the results")
    args = parser.parse_args(argv)
    quick = args.quick
    start, started = time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%S")
    load_before = [round(x, 2) for x in os.getloadavg()]
    shared = paths.eurosat_dir()
    if shared is None:
        raise SystemExit(f"no real EuroSAT folder ({paths.DATA_ENV}, data_cache/eurosat/ or ../shared/datasets/"
                         f"eurosat_rgb); this benchmark needs it: `{paths.GET_REAL_DATA}`")
    eurosat = shared / "train"
    land512 = landcover.landcover_cache_dir(512, {"train": 8 if quick else 40}) / "train"
    # One intra-op thread in this process, as in every DataLoader worker: at num_workers=0 the
    # per-sample transforms run here, and torch's default threads on 64 px tensors cost more than
    # they save on a busy machine (measured below as the "threads pitfall").
    default_threads = torch.get_num_threads()
    pitfall_dataset = loaders.first_images(loaders.image_folder_dataset(eurosat, 64, augmentation="cpu"), 64)
    pitfall = {f"threads={n}": loader_sweep.single_process_rate(pitfall_dataset, 64, threads=n)["images_per_second"]
               for n in (default_threads, 1)}
    log(f"threads pitfall (one process, CPU augmentation, images/s): {pitfall}")
    torch.set_num_threads(1)
    base = make_config("cpu" if not torch.cuda.is_available() else "gpu", batch_size=64, seed=0)
    sections = {}
    log("decoders")
    sections["decode"] = decode_section(eurosat, land512, quick)
    log("DataLoader sweeps")
    cuda = torch.cuda.is_available()
    grid64 = dict(num_workers=(0, 1, 2) if quick else (0, 1, 2, 4), pin_memory=(False, True) if cuda else (False,),
                  prefetch_factor=(2,) if quick else (2, 4), persistent_workers=(False, True))
    sections["sweeps"] = [
        sweep_section("EuroSAT 64 px", eurosat, 64, 256 if quick else 1024, grid64, base, quick),
        sweep_section("landcover-synth 512 px -> 224 px", land512, 224, 32 if quick else 160,
                      dict(num_workers=(0, 2) if quick else (0, 1, 2, 4)), base.replace(batch_size=32), quick)]
    log("pre-decoded cache")
    sections["cache"] = [cache_section("EuroSAT 64 px", eurosat, 64, 256 if quick else 1024, base, quick, 4096),
                         cache_section("landcover-synth 512 px", land512, 512, 32 if quick else 160,
                                       base.replace(batch_size=32), quick)]
    log("tar shards")
    sections["shards"] = shards_section(eurosat, 512 if quick else 4096, base, quick)
    log("augmentation")
    sections["augment"] = augment_section(eurosat, 256 if quick else 1024, base, quick)
    log("data wait")
    sections["data_wait"] = data_wait_section(eurosat, base, quick)
    sections["threads_pitfall"] = pitfall
    sections["pin_memory"] = ("Measured in the sweep (pin=1 rows) with batches copied to the GPU."
                              if cuda else "Not applicable: no CUDA device, so pinned host memory has no GPU copy "
                              "to speed up (make_loader leaves it off). Measured: N/A.")

    sweep64 = sections["sweeps"][0]
    cache64 = sections["cache"][0]["speedups"]
    loader_only = next(v for k, v in cache64.items() if k.startswith("none") and k.endswith("best workers"))
    targets = [
        {"target": "decode throughput per decoder (EuroSAT 64 px, images/s)",
         "measured": ", ".join(f"{r['decoder']} {r['images_per_second']:,.0f}" for r in sections["decode"]
                               if r["inputs"].startswith("EuroSAT")), "met": "reported"},
        {"target": "tuned loader >= 0.8 x single-core rate x usable cores (EuroSAT 64 px)",
         "measured": f"{sweep64['fraction_of_single_rate_times_cores']:.2f}",
         "met": "yes" if sweep64["fraction_of_single_rate_times_cores"] >= 0.8 else "no"},
        {"target": "tuned loader >= 0.8 x single-core rate x usable cores (landcover 512 px)",
         "measured": f"{sections['sweeps'][1]['fraction_of_single_rate_times_cores']:.2f}",
         "met": "yes" if sections["sweeps"][1]["fraction_of_single_rate_times_cores"] >= 0.8 else "no"},
        {"target": "pre-decoded cache >= 3x JPEG path at 64 px (loader alone, each at its best of workers 0/2)",
         "measured": f"{loader_only:.1f}x", "met": "yes" if loader_only >= 3 else "no"},
    ]
    results = {
        "hardware": machine.describe_hardware(), "hardware_detail": machine.hardware_summary(),
        "versions": machine.runtime_versions(), "usable_cores": devices.usable_cores(), "quick": quick,
        "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": time.perf_counter() - start, "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "note": ("The CPU was shared with other jobs during this run (see load averages): absolute images/s "
                 "are low and noisy; all comparisons were measured side by side in one run, so read the ratios."),
        "targets": targets, "sections": sections,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "data_pipeline_quick" if quick else "data_pipeline"
    write(out / f"{stem}.json", json.dumps(results, indent=2, default=str))
    write(out / f"{stem}.md", markdown(results))
    log(f"wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
