"""The `workbook` command (also `python -m course_lib`): one entry for every task, and the only
module that parses command lines. Each subcommand is a pair: `_add_<name>(subparsers)` declares
its arguments, `_<name>(args)` calls the library and returns the exit code.

Under torchrun every worker process runs `python -m course_lib train ...` (or `ddp-probe ...`),
and `main` runs through torch's `record`: a failing rank's exception lands in its error file
and torchrun's summary names the rank. Torch is imported only by the commands that use it, so a broken
torch/torchvision install is one line from `measure.install_check`, not a traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import re
import sys
from pathlib import Path

from course_lib.config import WorkbookError, make_config, parse_assignments, plural, unknown_name
from course_lib.paths import NotWritableError


def _add_config_arguments(parser: argparse.ArgumentParser, example: str = "-p batch_size=128") -> None:
    parser.add_argument("--profile", default="auto", help="smoke | cpu | gpu | auto | rehearsal (default auto)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help=f"any Config field, e.g. {example}")


# --- run: execute the notebooks ---------------------------------------------------------------

def _add_run(subparsers) -> None:
    from course_lib import runner

    parser = subparsers.add_parser("run", help="execute the notebooks with papermill into runs/<id>/")
    parser.add_argument("--profile", default="auto", help="smoke | cpu | gpu | auto (default: auto) | rehearsal (every "
                                                          "notebook at smoke sizes on the CPU with the gpu profile's switches) "
                                                          "| reference (the notebooks whose accuracy studies have reference "
                                                          "sizes: converged models, 5+ seeds; long)")
    parser.add_argument("--only", help="comma-separated notebook numbers, e.g. 00,03")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a notebook parameter, checked against the parameters cells (repeatable)")
    parser.add_argument("--out", help="output folder (default: runs/<run id>)")
    parser.add_argument("--cell-timeout", type=int, default=None,
                        help=f"seconds per cell (default {runner.CELL_TIMEOUT_SECONDS}; the reference profile "
                             f"{runner.REFERENCE_CELL_TIMEOUT_SECONDS})")
    parser.add_argument("--silent-cell-warning", type=float, default=runner.SILENT_CELL_SECONDS, metavar="SECONDS",
                        help="warn, naming the cell, when a cell prints nothing this long (0: never; default %(default)g)")
    parser.set_defaults(func=_run)


def _run(args) -> int:
    from course_lib import runner

    try:
        out, results = runner.run_workbook(args.profile, args.only, args.param, args.out,
                                           cell_timeout=args.cell_timeout, silence_seconds=args.silent_cell_warning)
    except runner.RunInterrupted as stop:
        print(f"workbook run: {stop}", file=sys.stderr)
        return stop.exit_code  # the shell's code for a process stopped by that signal (130 = 128 + SIGINT)
    failed = [r.notebook for r in results if r.status != "ok"]
    print(f"index: {out / 'index.html'}")
    if failed:
        print(f"workbook run: {plural(len(failed), 'notebook')} failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# --- doctor -----------------------------------------------------------------------------------

def _add_doctor(subparsers) -> None:
    parser = subparsers.add_parser("doctor", help="check this machine: inventory, measured speeds, advice")
    parser.add_argument("--json", action="store_true", help="print the facts as JSON instead of a report")
    parser.add_argument("--data-dir", help="dataset folder for the disk probe (default: EuroSAT if present, "
                                           "else the committed sample)")
    parser.add_argument("--no-measure", action="store_true", help="skip the matmul and disk probes")
    parser.set_defaults(func=_doctor)


def _doctor(args) -> int:
    from course_lib.measure import doctor

    if args.data_dir and not Path(args.data_dir).is_dir():
        raise NotADirectoryError(f"--data-dir {args.data_dir} is not a folder; give the dataset folder")
    facts = doctor.collect_facts(args.data_dir, measure=not args.no_measure)
    print(json.dumps(facts, indent=2, default=str) if args.json else doctor.format_report(facts))
    # Non-zero only for problems (a missing GPU is not one), so scripts can gate on it.
    return 1 if facts["problems"] else 0


# --- advise: which card fits the job -----------------------------------------------------------

def _add_advise(subparsers) -> None:
    parser = subparsers.add_parser("advise", help="for a model, batch, image size and precision: which GPU fits one "
                                                  "training step in memory, and its images/s at a stated MFU")
    parser.add_argument("--model", default="resnet50", help="timm model name (default resnet50)")
    parser.add_argument("--batch-size", type=int, default=256, help="images per step (default 256)")
    parser.add_argument("--image-size", type=int, default=224, help="pixels per side (default 224)")
    parser.add_argument("--precision", default="bf16", help="off (fp32) | fp16 | bf16 (default bf16)")
    parser.add_argument("--optimizer", default="sgd", help="sgd | adamw (its state is part of the memory)")
    parser.add_argument("--classes", type=int, default=1000, help="classes of the head (default 1000)")
    parser.add_argument("--mfu", type=float, default=None, help="share of the datasheet peak for images/s "
                                                                "(default 0.35; give your measured MFU)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=_advise)


def _advise(args) -> int:
    from course_lib.config import ConfigError
    from course_lib.measure import advise

    mfu = advise.DEFAULT_MFU if args.mfu is None else args.mfu
    for name, value in (("--batch-size", args.batch_size), ("--image-size", args.image_size), ("--classes", args.classes)):
        if value < 1:
            raise ConfigError(f"{name} must be 1 or more, got {value}")
    try:
        found = advise.advise(args.model, args.batch_size, args.image_size, args.precision, args.optimizer,
                              args.classes, mfu)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    except RuntimeError as error:  # timm: an unknown model name
        raise ConfigError(f"--model {args.model}: {error}") from None
    print(json.dumps([item.to_dict() for item in found], indent=2) if args.json
          else advise.format_advice(found, args.model, args.batch_size, args.image_size, args.precision, mfu))
    return 0


# --- gpu-check: every CUDA path in one timed command -----------------------------------------

def _add_gpu_check(subparsers) -> None:
    from course_lib.measure import gpu_check

    parser = subparsers.add_parser("gpu-check", help="measure every CUDA path in at most 8 minutes; "
                                                     "results to docs/results/<gpu>-<date>/",
                                   description="doctor, decoding with nvJPEG, fp32/fp16/bf16/channels_last/compile "
                                               "on ResNet-50 at 224 px with MFU, memory estimate vs measured and the "
                                               "out-of-memory batch, the speed-run on EuroSAT, DDP scaling (2+ GPUs). "
                                               "Without CUDA it prints one line and exits 0.")
    parser.add_argument("--parts", default=",".join(gpu_check.BUDGETS),
                        help=f"comma-separated subset of {','.join(gpu_check.BUDGETS)} (default: all)")
    parser.add_argument("--out-root", help=f"folder for the <gpu>-<date>/ results (default: {gpu_check.RESULTS_DIR}; "
                                           f"with --cpu-dry-run: {gpu_check.DRY_RUN_DIR})")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run every part's code on the CPU at tiny sizes (test_resnet at 32 px), to check the "
                             "command before a GPU slot; its numbers say nothing about a GPU")
    parser.set_defaults(func=_gpu_check)


def _gpu_check(args) -> int:
    from course_lib.config import ConfigError
    from course_lib.measure import gpu_check

    wanted = [name.strip() for name in args.parts.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in gpu_check.BUDGETS]
    if unknown:
        raise ConfigError(f"--parts {unknown[0]!r} is not one of {', '.join(gpu_check.BUDGETS)}")
    if args.cpu_dry_run:
        parts = [part for part in gpu_check.dry_run_parts() if part.name in wanted]
        folder = gpu_check.run_check(parts, out_root=Path(args.out_root or gpu_check.DRY_RUN_DIR), gpu="cpu dry run")
        print(f"gpu-check: dry run on the CPU, results in {folder}/ (README.md, gpu_check.json)")
        return 0
    reason = gpu_check.nothing_to_check()
    if reason:
        print(reason)
        return 0
    parts = [part for part in gpu_check.default_parts() if part.name in wanted]
    folder = gpu_check.run_check(parts, out_root=Path(args.out_root) if args.out_root else None)
    print(f"gpu-check: results in {folder}/ (README.md, gpu_check.json)")
    return 0


# --- data and scan ----------------------------------------------------------------------------

def _add_data(subparsers) -> None:
    from course_lib.data.download import DOWNLOADABLE

    data = subparsers.add_parser("data", help="generate or describe datasets")
    actions = data.add_subparsers(dest="action", metavar="ACTION", required=True)
    make = actions.add_parser("make", help="write landcover-synth as JPEG in ImageFolder layout")
    make.add_argument("--out", required=True, help="folder to create (must not exist)")
    make.add_argument("--image-size", type=int, default=64, help="pixels per side (16..1024)")
    make.add_argument("--train", type=int, default=200, help="training images per class")
    make.add_argument("--val", type=int, default=50, help="validation images per class")
    make.add_argument("--test", type=int, default=50, help="test images per class")
    make.add_argument("--seed", type=int, default=0)
    make.set_defaults(func=_data_make)
    get = actions.add_parser("get", help="download EuroSAT, CIFAR-10 or Imagenette (md5-checked) and lay it out "
                                         "as train/ valid/ test/ under data_cache/<name>/",
                             description="Download torchvision's archive of a real dataset (resumed when cut), check "
                                         "its md5, and lay it out as an ImageFolder with train/, valid/ and test/ "
                                         "folders, split the same way for everyone. A finished layout is not redone.")
    get.add_argument("name", choices=DOWNLOADABLE, help=" | ".join(DOWNLOADABLE))
    get.add_argument("--root", metavar="DIR", help="folder to lay the data out in (default: data_cache/<name>)")
    get.add_argument("--from", dest="archive", metavar="FILE",
                     help="an archive you already have (fetched by hand): checked against the md5, then laid out")
    get.add_argument("--no-progress", action="store_true", help="no progress bar")
    get.set_defaults(func=_data_get)
    info = actions.add_parser("info", help="classes and split sizes of a configured dataset")
    _add_config_arguments(info, "-p dataset=imagefolder -p data_dir=PATH")
    info.set_defaults(func=_data_info)

    scan = subparsers.add_parser("scan", help="check an image folder: unreadable or odd files and links; with "
                                              "--duplicates near-duplicates and leaks across splits; with --labels "
                                              "suspect labels")
    scan.add_argument("folder")
    scan.add_argument("--follow-links", action="store_true",
                      help="also scan the images inside linked folders (links are reported either way)")
    scan.add_argument("--duplicates", action="store_true",
                      help="perceptual hashes (pHash): near-duplicates within a split and leaks across train/val/test")
    scan.add_argument("--max-distance", type=int, default=4,
                      help="--duplicates: bits of 64 in which two hashes may differ (default 4)")
    scan.add_argument("--labels", action="store_true",
                      help="suspect labels of the training split: out-of-fold probabilities from k speed-run models, "
                           "ranked by cleanlab's confident learning")
    scan.add_argument("--folds", type=int, default=5, help="--labels: models, each scoring the images it did not see")
    scan.add_argument("--top", type=int, default=20, help="lines of matches or suspects to print (0: all; default 20)")
    scan.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_config_arguments(scan, "-p epochs=8 (--labels: the fold models' recipe, speedrun)")
    scan.set_defaults(func=_scan)


def _data_make(args) -> int:
    from course_lib.data import landcover

    out = landcover.make_landcover(args.out, args.image_size,
                                   {"train": args.train, "val": args.val, "test": args.test}, args.seed)
    total = sum(1 for _ in out.rglob("*.jpg"))
    size = sum(p.stat().st_size for p in out.rglob("*.jpg"))
    print(f"wrote {total} images ({size / 1e6:.1f} MB) to {out}")
    return 0


def _data_get(args) -> int:
    from course_lib.data import download

    result = download.get(args.name, args.root, args.archive, progress=not args.no_progress)
    print(result.summary())
    if result.warning:
        print(result.warning, file=sys.stderr)
    return 0


def run_config(profile: str, params: dict, **fixed):
    """(Config, DataChoice) that `workbook train`, `data info` and `speedrun` run with: the profile, the
    data `paths.choose_data` picks unless -p dataset or data_dir say, the -p values, then `fixed`."""
    from course_lib.data import datasets

    return datasets.config_with_data(profile, **{**params, **fixed})


def _data_info(args) -> int:
    from course_lib.data import datasets, pipeline

    config, choice = run_config(args.profile, parse_assignments(args.param))
    print(choice.line)
    bundle = pipeline.build_datasets(config)
    sizes = {s: len(getattr(bundle, s)) if getattr(bundle, s) is not None else 0 for s in datasets.SPLITS}
    print(f"{config.dataset} from {bundle.source}: {bundle.num_classes} classes {bundle.classes}; sizes {sizes}")
    return 0


def _scan(args) -> int:
    """File problems (the default); --duplicates and --labels add their own checks. Exit status 1 when
    any check found something."""
    from course_lib.config import ConfigError
    from course_lib.data import scan

    for name, value, low, high in (("--max-distance", args.max_distance, 0, 64), ("--folds", args.folds, 2, 100),
                                   ("--top", args.top, 0, 10**9)):
        if not low <= value <= high:
            raise ConfigError(f"{name} must be between {low} and {high}, got {value}")
    if args.duplicates or args.labels:
        # --labels' -p values are checked before any image is hashed: a bad value costs no wait
        config = _labels_config(args) if args.labels else None
        found = (_scan_duplicates(args) if args.duplicates else 0) + (_scan_labels(args, config) if args.labels else 0)
        return 1 if found else 0
    checked, problems = scan.scan_folder(args.folder, follow_links=args.follow_links)
    datasets = scan.dataset_folders(Path(args.folder))
    if datasets:
        print(f"{args.folder} is a folder of {plural(len(datasets), 'dataset')} "
              f"({', '.join(scan.printable(folder.name) for folder in datasets)}): each is checked as a dataset "
              "of its own (train/, val/ and their class folders)")
    for problem in problems:
        print(problem)
    print(f"checked {checked} files: {len(problems)} problem(s)")
    return 1 if problems else 0


def _scan_duplicates(args) -> int:
    from course_lib.data import near_duplicates

    checked, matches = near_duplicates.scan_duplicates(args.folder, args.max_distance, progress=not args.no_progress)
    for match in matches[:args.top or None]:
        print(match.line())
    print(near_duplicates.summary(checked, matches))
    return len(matches)


def _labels_config(args):
    """The config `scan --labels` trains its out-of-fold models with (ConfigError, one line, on a bad -p)."""
    config, _ = run_config(args.profile, parse_assignments(args.param), recipe="speedrun", dataset="imagefolder",
                           data_dir=args.folder)
    return config


def _scan_labels(args, config) -> int:
    from course_lib import machine
    from course_lib.analysis import label_issues
    from course_lib.engine import out_of_fold

    print(f"labels: {args.folds} {config.model} models ({config.epochs} epochs each) on the training split of "
          f"{args.folder}; {machine.describe_hardware()}", flush=True)
    bundle, targets, probabilities, flagged, names = out_of_fold.scan_labels(config, args.folds,
                                                                            progress=not args.no_progress)
    from course_lib.data.scan import printable  # class and file names may hold control characters

    table = label_issues.suspects_table(flagged, targets, probabilities, bundle.classes, names, limit=args.top)
    for _, row in table.iterrows():
        print(f"suspect: given {printable(row['given'])} (p {row['p(given)']:.2f}), predicted "
              f"{printable(row['predicted'])} (p {row['p(predicted)']:.2f}): {printable(row['image'])}")
    print(f"{len(flagged)} of {len(targets)} training labels flagged by confident learning "
          f"({len(flagged) / max(len(targets), 1):.1%}); spot-check them before dropping or relabelling")
    return len(flagged)


# --- bench ------------------------------------------------------------------------------------

_BENCH_COLUMNS = {
    "decode": ["inputs", "decoder", "image_size", "images", "images_per_second", "megabytes_per_second",
               "speedup_vs_pil"],
    "loader": ["setting", "images", "images_per_second"],
}


def _add_bench(subparsers) -> None:
    from course_lib.measure import bench

    parser = subparsers.add_parser("bench", help="measure data-pipeline speed and record it in the ledger")
    actions = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for benchmark in bench.BENCHMARKS.values():
        action = actions.add_parser(benchmark.name, help=benchmark.help)
        _add_config_arguments(action)
        action.add_argument("--json", action="store_true", help="print the result as JSON")
        action.add_argument("--no-record", action="store_true", help="do not write a ledger row")
        benchmark.add_arguments(action)
        action.set_defaults(func=_bench)


def _bench(args) -> int:
    from course_lib.measure import bench

    config = make_config(args.profile, **parse_assignments(args.param))
    result = bench.run_benchmark(args.benchmark, args, config, record=not args.no_record)
    if args.json:
        json.dump(dataclasses.asdict(result), sys.stdout, indent=2, default=str)
        print()
        return 0
    print(bench.format_table(result.rows, _BENCH_COLUMNS.get(args.benchmark)))
    for key, value in result.summary.items():
        if args.benchmark != "decode":
            print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
    print(f"hardware: {result.hardware}")
    return 0


# --- train (also what every torchrun worker runs) --------------------------------------------

def _add_train(subparsers) -> None:
    parser = subparsers.add_parser("train", help="train a timm model with the workbook engine",
                                   description="Train with the workbook engine. For several processes: "
                                               "torchrun --nproc-per-node N -m course_lib train -p ...")
    _add_config_arguments(parser, "-p model=resnet18 -p epochs=3 -p precision=bf16")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    parser.set_defaults(func=_train)


def _train(args) -> int:
    from course_lib.engine import train
    from course_lib.measure import memory_fit

    config, choice = run_config(args.profile, parse_assignments(args.param))
    if int(os.environ.get("RANK", "0")) == 0:
        print(choice.line, flush=True)
    memory_fit.check_fits(config)  # here, not in the engine: the estimator lives in measure (layering)
    try:
        result = train.fit(config, progress=not args.no_progress)
    except train.NonFiniteLossError as error:
        print(f"workbook train: error: {error}", file=sys.stderr)
        return 1
    if result.checkpoint_path and int(os.environ.get("RANK", "0")) == 0:
        print(f"checkpoint: {result.checkpoint_path}")
        if result.best_checkpoint_path:  # save_best
            print(f"best: {result.best_checkpoint_path} (epoch {result.best_epoch}, validation top-1 "
                  f"{result.best_val_top1:.2%})")
    return 0


# --- speedrun: a recipe against the clock ----------------------------------------------------

def _add_speedrun(subparsers) -> None:
    parser = subparsers.add_parser("speedrun", help="train a recipe against the clock: validation accuracy vs seconds",
                                   description="Train the speed-run recipe (or another) on the data every "
                                               "command picks (paths.choose_data: WORKBOOK_DATA, data_cache/, EuroSAT "
                                               "beside the project, else landcover-synth), printing validation top-1 "
                                               "(one view) against wall-clock seconds, then the final top-1 with and "
                                               "without test-time augmentation. With --seeds N: N races and their means "
                                               "with 95% intervals.")
    _add_config_arguments(parser, "-p epochs=8 -p tta_views=1")
    parser.add_argument("--recipe", default="speedrun", help="speedrun | speedrun2 | best (default speedrun)")
    parser.add_argument("--seeds", type=int, default=1, help="races with seeds 0..N-1 (default 1)")
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="stop at the optimizer step during which the clock passes this many seconds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    parser.set_defaults(func=_speedrun)


def _speedrun(args) -> int:
    from course_lib import machine
    from course_lib.config import ConfigError
    from course_lib.engine import speedrun

    if args.seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, got {args.seeds}")
    config, choice = run_config(args.profile, parse_assignments(args.param), recipe=args.recipe)
    print(choice.line, flush=True)
    print(f"recipe {args.recipe}: {config.model} at {config.image_size} px, {config.epochs} epochs, data "
          f"{config.data_dir or config.dataset}; {machine.describe_hardware()}", flush=True)
    seeds = [config.seed + offset for offset in range(args.seeds)]
    results = speedrun.race_seeds(config, seeds, budget_seconds=args.budget_seconds, progress=not args.no_progress,
                                  on_epoch=lambda seed, point: print(f"seed {seed} {speedrun.format_point(point)}",
                                                                     flush=True))
    for result in results:
        views = f", {config.tta_views} views {result.val_top1:.2%}" if config.tta_views > 1 else ""
        print(f"seed {result.config.seed}: final val top-1 1 view {result.single_view_top1:.2%}{views} after "
              f"{result.seconds:.1f} s (setup {result.setup_seconds:.1f} s, precision {result.precision})"
              + (f"; test split top-1 ({config.tta_views} view(s)) {result.test_top1:.2%}"
                 if result.test_top1 is not None else ""))
    print("\n".join(speedrun.summary_lines(speedrun.seed_summary(results))))
    return 0


# --- ddp: launch under torchrun, or measure scaling; ddp-probe is the probe's worker ----------

def _add_ddp(subparsers) -> None:
    parser = subparsers.add_parser("ddp", help="launch DDP training with torchrun, or measure scaling",
                                   description="Run `workbook train` under torchrun (c10d rendezvous on "
                                               "127.0.0.1); --scaling measures 1..N workers instead.")
    parser.add_argument("--nproc-per-node", type=int, default=2, help="worker processes per node (default 2)")
    parser.add_argument("--nnodes", type=int, default=1,
                        help="torchrun processes on this machine standing in for nodes")
    _add_config_arguments(parser)
    parser.add_argument("--scaling", action="store_true",
                        help="measure step time for 1..N workers and the all-reduce share")
    parser.add_argument("--bandwidth", action="store_true",
                        help="time one all-reduce of 1 KiB to 256 MiB across N processes (algorithm and bus "
                             "bandwidth, as nccl-tests reports them)")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads per process (default 1)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before the launch and all its processes are stopped (default: sized from "
                             "the run's epochs and images, see torchrun.fitting_timeout)")
    parser.add_argument("--port", type=int, default=0,
                        help="rendezvous port on 127.0.0.1 (default 0: a free one); a taken port is refused")
    parser.set_defaults(func=_ddp)

    probe = subparsers.add_parser("ddp-probe", help="one worker of `workbook ddp --scaling` (run under torchrun)")
    probe.add_argument("--task", choices=("scaling", "equivalence", "bandwidth", "fail"), default="scaling")
    _add_config_arguments(probe)
    probe.add_argument("--steps", type=int, default=5, help="timed steps per setting (equivalence: SGD steps)")
    probe.add_argument("--warmup", type=int, default=2, help="steps thrown away before timing")
    probe.add_argument("--profile-steps", type=int, default=3, help="steps under torch.profiler")
    probe.add_argument("--global-batch", type=int, default=0,
                       help="images per step over all workers for strong scaling; 0: batch_size x world size")
    probe.add_argument("--out", default="", help="folder for the weights file (equivalence)")
    probe.add_argument("--max-bytes", type=int, default=0,
                       help="largest all-reduce message (bandwidth; 0: 256 MiB)")
    probe.set_defaults(func=_ddp_probe)


def _ddp(args) -> int:
    from course_lib.chapters import ddp_scaling
    from course_lib.engine import ddp, torchrun

    params = parse_assignments(args.param)
    if args.bandwidth:
        from course_lib.engine import allreduce

        sweep = allreduce.measure(args.nproc_per_node, params, args.profile, threads_per_process=args.threads,
                                  timeout=args.timeout)
        print(sweep.table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(sweep.line())
        return 0
    if args.scaling:
        report = ddp.measure_scaling(args.nproc_per_node, params, args.profile, timeout=args.timeout)
        print(report.table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        for line in ddp_scaling.scaling_advice(report, threads_per_process=args.threads):
            print("-", line)
        print(f"hardware: {report.hardware}")
        return 0
    result = torchrun.launch(args.nproc_per_node, params, args.profile, nnodes=args.nnodes,
                             threads_per_process=args.threads, timeout=args.timeout, check=False,
                             port=args.port)
    if not result.ok:
        print(result.failure_report(), file=sys.stderr)
        return 1
    print(f"ledger run id {result.run_id}: {len(result.rows)} row(s)")
    return 0


def _ddp_probe(args) -> int:
    from course_lib.engine import ddp_probe

    config = make_config(args.profile, **parse_assignments(args.param))
    ddp_probe.run(args.task, config, steps=args.steps, warmup=args.warmup, profile_steps=args.profile_steps,
                  global_batch=args.global_batch, out=args.out, max_bytes=args.max_bytes)
    return 0


# --- eval -------------------------------------------------------------------------------------

def _add_eval(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a checkpoint: top-1/top-5, per-class, ECE, confusions")
    parser.add_argument("checkpoint", help="a checkpoint written by `workbook train`")
    parser.add_argument("--split", default="val", choices=("train", "val", "test"))
    parser.add_argument("--ema", action="store_true", help="evaluate the checkpoint's weight-EMA copy")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override a stored config value (e.g. device=cpu, batch_size=256, data_dir=...)")
    parser.add_argument("--name", help="name of the saved evaluation (default: <checkpoint>-<split>-<time>)")
    parser.add_argument("--out", help="folder for the .npz/.json (default: runs/evals)")
    parser.add_argument("--top-pairs", type=int, default=10, help="most-confused pairs to list")
    parser.add_argument("--tta", type=int, default=None, metavar="VIEWS",
                        help="test-time augmentation: average over 2 (mirror) or 8 (rotations and mirrors) views "
                             "(default: the checkpoint's tta_views)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=_eval)


def _eval(args) -> int:
    from course_lib.analysis import confusion, evaluation
    from course_lib.data.scan import printable
    from course_lib.machine import describe_hardware

    result = evaluation.evaluate(args.checkpoint, args.split, name=args.name, out_dir=args.out,
                                 weights="ema" if args.ema else "model", tta_views=args.tta,
                                 **parse_assignments(args.param))
    summary = result.summary()
    if args.json:
        print(json.dumps({"path": str(result.path), **summary}, indent=2))
        return 0
    print(f"{result.name}: {summary['images']} images, {summary['classes']} classes ({describe_hardware()})")
    print(f"top-1 {summary['top1']:.4f}  top-{summary['top5_k']} {summary['top5']:.4f}  "
          f"macro F1 {summary['macro_f1']:.4f}  weighted F1 {summary['weighted_f1']:.4f}  ECE {summary['ece']:.4f}")
    # class names come from folder names, which may hold a newline or an escape sequence: written as escapes
    print(result.per_class().rename(index=printable).to_string(float_format=lambda v: f"{v:.3f}"))
    pairs = confusion.most_confused_pairs(result.counts(), result.classes, args.top_pairs)
    if len(pairs):
        print("most-confused pairs:")
        named = pairs.drop(columns=["true_index", "predicted_index"]).assign(
            true=lambda frame: frame["true"].map(printable), predicted=lambda frame: frame["predicted"].map(printable))
        print(named.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"saved {result.path}")
    return 0


# --- compare ----------------------------------------------------------------------------------

def _add_compare(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare two runs or ledger rows (the parameters that differ beside the results that "
                        "differ), or two evaluations image by image (deltas with bootstrap CIs)",
        description="Two run ids (folders under runs/) or two ledger row ids: the parameters that differ beside "
                    "the results that differ, with intervals where the results have them (Newcombe's for two "
                    "accuracies). Two evaluations: per-class deltas with paired bootstrap intervals and the "
                    "images that flipped.")
    parser.add_argument("before", metavar="A", help="the baseline: a run id or folder, a ledger row id, or an "
                                                    "evaluation (name, eval row id, saved .npz, or a checkpoint .pt, "
                                                    "evaluated now)")
    parser.add_argument("after", metavar="B", help="the changed one, in the same form")
    parser.add_argument("--split", default="val", choices=("train", "val", "test"),
                        help="split to evaluate a checkpoint on (default val)")
    parser.add_argument("--draws", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    parser.add_argument("--flips", type=int, default=10, help="flipped images listed per direction (text output)")
    parser.add_argument("--json", action="store_true", help="print the whole comparison as JSON")
    parser.set_defaults(func=_compare)


def _compare(args) -> int:
    from course_lib.analysis import comparison, run_comparison

    kind, before, after = run_comparison.resolve_pair(args.before, args.after, args.split)
    if kind in ("run", "row"):
        try:
            changes = (run_comparison.compare_runs if kind == "run" else run_comparison.compare_rows)(
                before, after, level=args.level, draws=args.draws)
        except ValueError as error:
            raise WorkbookError(str(error)) from None
        print(json.dumps(changes.to_dict(), indent=2, default=str) if args.json else changes.format())
        return 0
    try:
        result = comparison.compare(before, after, draws=args.draws, level=args.level, seed=args.seed)
    except ValueError as error:
        raise WorkbookError(str(error)) from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return 0
    percent = f"{args.level:.0%}"
    # A first, then B, in the order of the numbers below (A -> B, delta = B - A)
    print(f"A: {before.name} -> B: {after.name} (delta = B - A): {len(before.labels)} images, "
          f"{before.num_classes} classes, {percent} paired bootstrap intervals over {args.draws} resamples")
    for name in ("top1", "macro_f1"):
        o = result.overall[name]
        print(f"{name:9s} {o['before']:.4f} -> {o['after']:.4f}  delta {o['delta']:+.4f} "
              f"[{o['low']:+.4f}, {o['high']:+.4f}]")
    shown = result.per_class[[f"{s}_{part}" for s in comparison.SCORES for part in ("delta", "low", "high")]
                             + ["support"]]
    print(shown.to_string(float_format=lambda v: f"{v:+.3f}"))
    for direction, table in result.flips.items():
        print(f"{direction.replace('_', ' ')}: {len(table)} images")
        if len(table):
            print(table.head(args.flips)[["image", "true", "predicted_before", "predicted", "confidence"]].to_string(
                index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


# --- report -----------------------------------------------------------------------------------

def _add_report(subparsers) -> None:
    parser = subparsers.add_parser("report", help="regenerate runs/<id>/index.html with each notebook's results")
    parser.add_argument("run", metavar="RUN_ID", help="a run id (a folder under runs/) or a run folder")
    parser.set_defaults(func=_report)


def _report(args) -> int:
    from course_lib import report

    print(f"index: {report.regenerate(args.run)}")
    return 0


# --- export -----------------------------------------------------------------------------------

def _add_export(subparsers) -> None:
    parser = subparsers.add_parser("export", help="export a checkpoint as ONNX or torch.export .pt2 (optionally int8), "
                                                  "checked and timed")
    parser.add_argument("checkpoint", help="a checkpoint written by `workbook train`")
    parser.add_argument("--format", default="onnx", choices=("onnx", "pt2"),
                        help="onnx (served by onnxruntime) or pt2 (torch.export); default onnx")
    parser.add_argument("--int8", action="store_true",
                        help="post-training int8, calibrated on training images (onnx: onnxruntime static QDQ; "
                             "pt2: PT2E with the X86 Inductor quantizer)")
    parser.add_argument("--output", help="the artifact's path (default: beside the checkpoint, e.g. last-int8.onnx)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing artifact (the checkpoint being exported is never replaced)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per batch size (median reported)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override a stored config value for the data (e.g. data_dir=..., batch_size=256)")
    parser.set_defaults(func=_export)


def _export(args) -> int:
    from course_lib.deploy import export

    report = export.export_checkpoint(args.checkpoint, args.format, int8=args.int8, output=args.output,
                                      repeats=args.repeats, force=args.force, **parse_assignments(args.param))
    latency = report["latency"]
    print(f"wrote {report['artifact']} ({report['bytes'] / 1e6:.2f} MB): val top-1 {report['top1']:.4f} "
          f"(PyTorch {report['pytorch_top1']:.4f}), max |logit difference| {report['max_abs_logit_difference']:.2e}, "
          f"{latency['ms@1']:.2f} ms at batch 1, {latency['images/s@64']:.0f} images/s at batch 64 "
          f"({report['hardware']})")
    print(f"measurements: {report['artifact']}.json")
    return 0


# --- claims -----------------------------------------------------------------------------------

def _add_claims(subparsers) -> None:
    from course_lib.ledger import LEDGER_ENV

    parser = subparsers.add_parser("claims", help="the articles' claims: claimed vs measured, interval and verdict, "
                                                  "newest measurement per machine")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--path", help=f"ledger file (default: ${LEDGER_ENV} or runs/ledger.sqlite)")
    parser.set_defaults(func=_claims)


def _given_ledger(path: str | None):
    """The ledger a reading command's `--path` names (None: the default one). A path with no ledger is refused
    in one line rather than created, with its folder, as an empty ledger (a typo once did that)."""
    from course_lib import ledger

    if path is None:
        return None
    if not Path(path).is_file():
        raise FileNotFoundError(f"--path {path}: no ledger file there; give the runs/ledger.sqlite that "
                                "`workbook run` or `workbook train` wrote (or leave --path out)")
    return ledger.Ledger(path)


def _claims(args) -> int:
    from course_lib import ledger
    from course_lib.analysis import claims

    board = claims.scoreboard(_given_ledger(args.path))
    print(json.dumps(board, indent=1, ensure_ascii=False) if args.json else claims.format_scoreboard(board))
    return 0


# --- reference --------------------------------------------------------------------------------

def _add_reference(subparsers) -> None:
    from course_lib.ledger import LEDGER_ENV

    parser = subparsers.add_parser("reference", help="reference results: a finished run's claims committed as data "
                                                     "(results/reference/<hardware>/<NN>.json), shown beside yours")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    save = actions.add_parser("save", help="make the reference of every notebook of a finished cpu, gpu or reference run")
    save.add_argument("run_id", help="the run's id (its folder under runs/, printed by `workbook run`)")
    save.add_argument("--path", help=f"ledger file (default: ${LEDGER_ENV} or runs/ledger.sqlite)")
    save.add_argument("--to", help="folder to write into (default: results/reference under the project)")
    actions.add_parser("list", help="the committed references: notebook, machine, date, command")
    actions.add_parser("table", help="the committed references' accuracy verdicts: counts per notebook and every "
                                     "accuracy claim, as docs/results.md's markdown tables")
    parser.set_defaults(func=_reference)


def _reference(args) -> int:
    from course_lib import ledger
    from course_lib.analysis import reference

    if args.action == "table":
        from course_lib.analysis import claims

        print(claims.accuracy_counts_table(claims.accuracy_counts(whose="reference")), "",
              claims.accuracy_results_table(), sep="\n")
        return 0
    if args.action == "list":
        found = sorted(reference.folder().glob("*/*.json"))
        for item in reference.load_all(found):
            print(f"{item.notebook}: {len(item.claims)} claim(s), {item.hardware}, profile {item.profile}, "
                  f"{item.date}: `{item.command}` ({item.path})")
        if not found:
            print(f"no reference results in {reference.folder()}")
        return 0
    made = reference.from_run(args.run_id, _given_ledger(args.path))
    for item in made:
        path = reference.save(item, Path(args.to) if args.to else None)
        beside = path.parent.name == item.profile  # `reference.target_path`: the long run stays the reference
        print(f"wrote {path}: notebook {item.notebook}, {len(item.claims)} claim(s)"
              + (f"; the {reference.LONG_PROFILE}-profile result beside it stays the chapter's reference" if beside else ""))
    return 0


# --- docs -------------------------------------------------------------------------------------

def _add_docs(subparsers) -> None:
    parser = subparsers.add_parser("docs", help="the README's and docs/*.md's generated tables and pictures, "
                                                "from the committed results files")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    tables = actions.add_parser("tables", help="rewrite every generated table in README.md and docs/*.md from "
                                               "benchmarks/results/, results/reference/ and the Config")
    tables.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each stale table")
    figures = actions.add_parser("figures", help="draw docs/images/race.png from benchmarks/results/"
                                                 "speedrun_speedrun.json (and the explorer's picture from --eval)")
    build = actions.add_parser("build", help="a static site (MkDocs) of README, docs/*.md, a run's executed chapters "
                                             "and the claims scoreboard, into runs/<id>/site/")
    build.add_argument("run", nargs="?", help="run id or folder (default: the newest run under runs/; with none, "
                                              "the notebooks are executed first in --profile)")
    build.add_argument("--profile", default="smoke", help="profile of the run made when there is none (default smoke)")
    figures.add_argument("--eval", metavar="EVAL", help="a saved evaluation (runs/evals/NAME.npz) whose explorer "
                                                        "picture becomes docs/images/explorer-eurosat.png")
    parser.set_defaults(func=_docs)


def _docs(args) -> int:
    from course_lib import doc_tables, paths

    root = paths.project_root()
    if args.action == "build":
        return _docs_build(args, root)
    if args.action == "tables":
        changed = doc_tables.update(root, check=args.check)
        for item in changed:
            print(f"{'stale' if args.check else 'rewrote'}: {item}")
        if args.check and changed:
            print("run `workbook docs tables` to regenerate them", file=sys.stderr)
            return 1
        if not changed:
            print(f"{sum(map(len, doc_tables.block_names(root).values()))} generated table(s), all up to date")
        return 0
    doc_tables.race_figure(root / doc_tables.RACE_FIGURE)
    print(f"wrote {doc_tables.RACE_FIGURE}")
    if args.eval:
        evaluation_path = Path(args.eval)
        if not evaluation_path.is_file():
            raise WorkbookError(f"--eval {args.eval}: no such saved evaluation; `workbook eval CHECKPOINT` writes "
                                "one under runs/evals/")
        doc_tables.explorer_figure(evaluation_path, root / doc_tables.EXPLORER_FIGURE)
        print(f"wrote {doc_tables.EXPLORER_FIGURE}")
    return 0


def _docs_build(args, root: Path) -> int:
    from course_lib import book, paths, runner

    if args.run:
        run = Path(args.run) if Path(args.run).is_dir() else root / paths.RUNS_DIR / args.run
        if not (run / "summary.json").is_file():
            raise WorkbookError(f"{args.run} is not a run (no summary.json in {run}); `ls runs/` lists the runs")
    elif (found := book.newest_finished_run(root / paths.RUNS_DIR))[1] or found[0] is not None:
        run, passed = found
        if run is None:
            raise WorkbookError(f"no finished run under runs/: {', '.join(p.name for p in passed)} still running, killed "
                                "mid-run or unreadable; name one with `workbook docs build RUN_ID`, or finish a run")
        if passed:
            print(f"docs build: passed over {', '.join(p.name for p in passed)} (still running, killed mid-run or "
                  f"unreadable); building {run.name}", flush=True)
    else:
        print(f"docs build: no run under runs/ yet; executing the notebooks in the {args.profile} profile first",
              flush=True)
        run, _ = runner.run_workbook(args.profile)
    index = book.build(run, root)
    print(f"docs build: the site of run {run.name} is in {index.parent}/ (open {index})")
    return 0


# --- ledger -----------------------------------------------------------------------------------

def _add_ledger(subparsers) -> None:
    from course_lib.ledger import LEDGER_ENV

    parser = subparsers.add_parser("ledger", help="list recorded results")
    parser.add_argument("--kind", help="only rows of this kind (notebook, train, bench, eval ...)")
    parser.add_argument("--name", help="only rows with this name")
    parser.add_argument("--run", dest="run_id", help="only rows of this run id")
    parser.add_argument("--limit", type=int, default=50, help="rows to show, newest first (0 = all)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--path", help=f"ledger file (default: ${LEDGER_ENV} or runs/ledger.sqlite)")
    parser.add_argument("--check", action="store_true",
                        help="report the ledger's state (quick_check, schema, rows, unsaved rows); exit 1 if damaged")
    parser.add_argument("--import-unsaved", action="store_true",
                        help="move the rows kept in ledger-unsaved.jsonl (when the ledger could not be written) "
                             "into the ledger")
    parser.set_defaults(func=_ledger)


def _ledger(args) -> int:
    from course_lib import ledger

    path = Path(args.path) if args.path else ledger.default_path()
    if args.check:
        return _ledger_check(path)
    if args.import_unsaved:
        count = ledger.Ledger(path).import_unsaved()
        print(f"imported {count} row(s) from {ledger.unsaved_path(path)} into {path}")
        return 0
    if not path.exists():
        print(f"no ledger at {path}; run `workbook run` or `workbook train` first")
        return 0
    records = ledger.Ledger(path).rows(kind=args.kind, name=args.name, run_id=args.run_id,
                                       limit=args.limit or None)
    print(json.dumps(records, indent=2) if args.json else ledger.format_rows(records))
    return 0


def _ledger_check(path: Path) -> int:
    """One line on the ledger (ok with its row count, or the LedgerError), one on unsaved rows."""
    from course_lib import ledger

    unsaved = ledger.unsaved_path(path)
    if not path.exists():
        print(f"no ledger at {path} yet; the first recorded run creates it")
        state = 0
    else:
        try:
            print(f"ledger {path}: ok (quick_check passed, {ledger.Ledger(path).check()} rows)")
            state = 0
        except ledger.LedgerError as error:
            print(f"{error}")
            state = 1
    if unsaved.exists():
        try:
            waiting = f"{len(ledger.read_unsaved(unsaved))} row(s)"
        except ledger.LedgerError as error:
            waiting, state = f"rows, but {error}", 1
        print(f"{unsaved} holds {waiting} the ledger could not take; once the ledger is ok, "
              "`workbook ledger --import-unsaved` moves them in")
    return state


# Subcommands, in the order `workbook --help` lists them.
SUBCOMMANDS = (_add_run, _add_doctor, _add_advise, _add_gpu_check, _add_data, _add_bench, _add_train, _add_speedrun, _add_ddp,
               _add_eval, _add_compare, _add_export, _add_report, _add_claims, _add_reference, _add_ledger,
               _add_docs)


class _Parser(argparse.ArgumentParser):
    """argparse, with a close match offered for a mistyped command or choice (`workbook trian`: did you
    mean 'train'?); subcommands' parsers are of this class too (add_subparsers takes the parent's)."""

    def error(self, message: str):
        found = re.search(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if found:
            argument, given, choices = found.groups()
            message = f"argument {argument}: " + unknown_name("choice", given, re.findall(r"'([^']*)'", choices))
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbook", description="Fast CNN Training Workbook")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    if "TORCHELASTIC_ERROR_FILE" in os.environ:
        # Under torchrun: a failing rank's exception goes to its error file, so the summary names it.
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(_main)(argv)
    try:
        return _main(argv)
    except (ImportError, OSError, RuntimeError):
        # A torch/torchvision pair that does not import together fails any command, `doctor` included:
        # one line naming the pair and the fix, once a child process confirms it (else the error as it is).
        from course_lib.measure import install_check

        problem = install_check.torch_pair_problem()
        if problem is None:
            raise
        print(f"workbook: error: {problem}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (WorkbookError, FileNotFoundError, NotADirectoryError, FileExistsError, NotWritableError) as error:
        # Bad input is a one-line message, not a traceback.
        print(f"workbook {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:
        if argv is None:  # this process's own command, which ends next: Python's collections at exit skip what
            gc.freeze()  # torch, timm and pandas made (docs/development.md: 0.9 s less per process, workers too)
