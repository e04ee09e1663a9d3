"""`workbook bench <name>`: benchmarks that print a table (or `--json`) and record one ledger row
(kind "bench"). Shipped: `decode` (decoders, images/s and MB/s per image size: `benchmark_decoders`)
and `loader` (DataLoader knob sweep, knee, and efficiency against the one-core rate).

Adding a benchmark: write `add_arguments(parser)` and `run(args, config) -> BenchResult`, then
`register("name", "help", add_arguments, run)` in this module (or in a module imported before the
CLI is built); `add_cli` gives every benchmark --profile, -p NAME=VALUE and --json.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

from course_lib.config import Config, ConfigError


@dataclasses.dataclass
class BenchResult:
    rows: list  # one dict per measurement, for tables and DataFrames
    summary: dict  # flat numbers for the ledger's metrics column
    parameters: dict  # what was measured, for the ledger's parameters column
    hardware: str = ""  # one line naming the machine (filled in by run_benchmark)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    name: str
    help: str
    add_arguments: Callable
    run: Callable


BENCHMARKS: dict[str, Benchmark] = {}


def register(name: str, help: str, add_arguments: Callable, run: Callable) -> None:
    """Make `workbook bench <name>` exist."""
    BENCHMARKS[name] = Benchmark(name, help, add_arguments, run)


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"expected comma-separated integers like 0,1,2, got {text!r}") from None


def run_benchmark(name: str, args, config: Config, record: bool = True) -> BenchResult:
    """Run one registered benchmark and write its ledger row."""
    from course_lib import ledger, machine

    start = time.perf_counter()
    result = BENCHMARKS[name].run(args, config)
    result.hardware = machine.describe_hardware()
    if record:
        ledger.record("bench", name, duration_seconds=time.perf_counter() - start,
                      parameters=result.parameters, metrics=result.summary)
    return result


def images_for_size(image_size: int) -> int:
    """Images per timed pass: enough for ~0.1 s on one core, fewer as images grow."""
    return max(16, min(512, int(512 * (64 / image_size) ** 1.5)))


def time_decoder(decoder, blobs: list[bytes], repeats: int = 5, warmup: int = 1,
                 batch: int = 64) -> list[float]:
    """Seconds to decode all `blobs`, once per repeat, after `warmup` thrown-away passes (the one
    timing helper: nvJPEG is asynchronous, so the GPU is synchronised before each clock read)."""
    from course_lib.instruments.timing import time_repeats

    def decode_all() -> None:
        for first in range(0, len(blobs), batch):
            decoder.decode_batch(blobs[first:first + batch])

    return time_repeats(decode_all, repeats=repeats, warmup=warmup, device=decoder.device).seconds


def benchmark_decoders(blobs: list[bytes], decoders: list[str] | None = None, repeats: int = 5,
                       warmup: int = 1, label: str = "") -> list[dict]:
    """Images/s and MB/s (compressed input) per decoder on the same in-memory bytes, median of
    `repeats`. Reading files is excluded: this is the CPU (or GPU) cost of decoding alone."""
    import statistics

    from course_lib.data.decode import available_decoders, get_decoder

    if not blobs:
        raise ValueError("benchmark_decoders needs at least one encoded image")
    megabytes = sum(len(b) for b in blobs) / 1e6
    height, width = get_decoder("pil").decode(blobs[0]).shape[1:]
    rows = []
    for name in decoders or available_decoders():
        decoder = get_decoder(name)
        times = time_decoder(decoder, blobs, repeats, warmup)
        median = statistics.median(times)
        rows.append({
            "inputs": label, "decoder": name, "device": decoder.device, "image_size": int(max(height, width)),
            "images": len(blobs), "megabytes": megabytes, "repeats": repeats,
            "seconds_median": median, "images_per_second": len(blobs) / median,
            "megabytes_per_second": megabytes / median,
            "images_per_second_repeats": [len(blobs) / seconds for seconds in times],  # for intervals
        })
    fastest_pil = next((r["images_per_second"] for r in rows if r["decoder"] == "pil"), None)
    for row in rows:
        row["speedup_vs_pil"] = row["images_per_second"] / fastest_pil if fastest_pil else None
    return rows


def decode_inputs(image_size: int, folder=None, images: int | None = None) -> tuple[list[bytes], str]:
    """(encoded bytes, description): files from `folder` when given, else landcover-synth JPEGs
    of `image_size` generated in memory."""
    from course_lib.data import decode

    count = images or images_for_size(image_size)
    if folder:
        files = decode.image_files(folder, count)
        return [path.read_bytes() for path in files], f"{len(files)} files from {folder}"
    return decode.jpeg_samples(image_size, count), f"{count} landcover-synth JPEGs (quality 90)"


def run_decode(args, config: Config) -> BenchResult:
    from course_lib.data import decode
    from course_lib.paths import eurosat_dir

    folder = args.folder or eurosat_dir()
    decoders = args.decoders.split(",") if args.decoders else decode.available_decoders()
    rows = []
    if folder:  # the real images at their own size
        blobs, label = decode_inputs(0, folder, args.images or 512)
        rows += benchmark_decoders(blobs, decoders, args.repeats, label=label)
    for size in _int_list(args.sizes):
        blobs, label = decode_inputs(size, None, args.images)
        rows += benchmark_decoders(blobs, decoders, args.repeats, label=label)
    summary = {f"{r['decoder']}_{r['image_size']}px{'_files' if 'files' in r['inputs'] else ''}_images_per_second":
               r["images_per_second"] for r in rows}
    return BenchResult(rows, summary, {"sizes": args.sizes, "folder": str(folder or ""), "repeats": args.repeats,
                                       "decoders": decoders})


def _decode_arguments(parser) -> None:
    parser.add_argument("--sizes", default="64,256,1024", help="generated JPEG sizes in pixels, comma-separated")
    parser.add_argument("--folder", help="also time real files from this folder (default: EuroSAT when present)")
    parser.add_argument("--images", type=int, help="images per pass (default: fewer for bigger sizes)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes; the median is reported")
    parser.add_argument("--decoders", help="comma-separated subset of pil,opencv,torchvision,nvjpeg")


def run_loader(args, config: Config) -> BenchResult:
    import torch

    from course_lib import devices
    from course_lib.data import loaders
    from course_lib.measure import loader_sweep

    folder = args.folder or loaders.default_image_folder(config)
    dataset = loaders.image_folder_dataset(folder, config.image_size, decoder=args.decoder,
                                           augmentation=args.augmentation, bad_images=config.bad_images)
    dataset = loaders.first_images(dataset, args.images)
    pins = (False, True) if torch.cuda.is_available() else (False,)
    settings = loader_sweep.setting_grid(_int_list(args.workers), pins, _int_list(args.prefetch),
                                    [bool(v) for v in _int_list(args.persistent)])
    device = devices.transfer_device(config.device)
    rows = loader_sweep.sweep_loader(dataset, config, settings, epochs=args.epochs, repeats=args.repeats, device=device)
    knee = loader_sweep.find_knee(rows)
    best = max(rows, key=lambda r: r["images_per_second"])
    one_core = loader_sweep.single_process_rate(dataset, images=min(256, len(dataset)))
    cores = devices.usable_cores()
    summary = {
        "best_images_per_second": best["images_per_second"], "best_setting": best["setting"],
        "knee_images_per_second": knee["images_per_second"], "knee_setting": knee["setting"],
        "knee_num_workers": knee["num_workers"],
        "single_process_images_per_second": one_core["images_per_second"], "usable_cores": cores,
        "fraction_of_cores_times_single_rate": best["images_per_second"] / (one_core["images_per_second"] * cores),
    }
    return BenchResult(rows, summary, {"folder": str(folder), "images": len(dataset), "decoder": args.decoder,
                                       "augmentation": args.augmentation, "batch_size": config.batch_size,
                                       "image_size": config.image_size, "epochs": args.epochs,
                                       "device": str(device or "cpu")})


def _loader_arguments(parser) -> None:
    parser.add_argument("--folder", help="ImageFolder to read (default: the configured dataset's train folder)")
    parser.add_argument("--workers", default="0,1,2,4", help="num_workers values, comma-separated")
    parser.add_argument("--prefetch", default="2", help="prefetch_factor values, comma-separated")
    parser.add_argument("--persistent", default="0", help="persistent_workers values (0,1), comma-separated")
    parser.add_argument("--images", type=int, default=2048, help="images per epoch (first N of the folder)")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per setting (after one warm-up)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats; the median is reported")
    parser.add_argument("--decoder", default="pil", help="pil | opencv | torchvision")
    parser.add_argument("--augmentation", default="cpu", help="cpu | device | none (where augmentation runs)")


register("decode", "images/s and MB/s of each JPEG decoder at several image sizes", _decode_arguments, run_decode)
register("loader", "DataLoader knob sweep: images/s per setting, the knee, efficiency vs one core",
         _loader_arguments, run_loader)


def format_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain-text table, numbers to 4 significant digits."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0])
    cells = [[(f"{r.get(c):.4g}" if isinstance(r.get(c), float) else str(r.get(c, ""))) for c in columns]
             for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)
