"""Imagenette against fastai's leaderboard (issue 47 point 7): the `imagenette` recipe, 5 runs, top-1 and top-5.

    .venv/bin/python benchmarks/bench_imagenette.py                    # 5 runs (seeds 0-4); the gpu profile where CUDA is
    .venv/bin/python benchmarks/bench_imagenette.py -p image_size=128  # the leaderboard row's own size
    .venv/bin/python benchmarks/bench_imagenette.py --profile smoke    # the script's check, on the committed sample

The protocol is the leaderboard's (github.com/fastai/imagenette): random initial weights, no test-time augmentation,
5 epochs, the mean of 5 runs (seeds 0-4), here with its 95% Student-t interval. The figures are scored on
Imagenette's official val, the split the leaderboard scores, which `workbook data get imagenette` lays out as test/;
`valid` (a fixed tenth of the official train) is reported beside it and is the split to tune the recipe on. Then
the gap to the leaderboard's 87.43% (5 epochs at 128 px, a 5-run mean), with what differs besides the recipe: the
resolution, 90% of the training images, the hardware. Writes benchmarks/results/imagenette.json and .md (hardware
and load average named) and records the claim `imagenette_leaderboard` in the ledger (`workbook claims`; notebook
12 reads the JSON back). It reads data_cache/imagenette/ (or -p data_dir=FOLDER with train/ valid/ test/); without
it, it prints one line saying how to get the data and exits 0. In the smoke profile a tiny net trains two steps on
the committed sample (or on -p data_dir): a check of the script, not a measurement.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from _shared import argument_parser, imagenette_or_skip, write  # noqa: E402 (puts the project on sys.path)
from course_lib import machine  # noqa: E402
from course_lib.analysis import claims, imagenette  # noqa: E402
from course_lib.chapters.time_to_accuracy import IMAGENETTE_SMOKE  # noqa: E402
from course_lib.config import SAMPLE_DATA_DIR, make_config, parse_assignments, resolve_profile  # noqa: E402
from course_lib.engine import speedrun  # noqa: E402

SAMPLE_SPLIT = "the committed sample's test split (a check of the script)"


def percent(value) -> str:
    return "-" if value is None else f"{value:.2%}"


def race(config, seeds: int) -> list:
    """`seeds` races of `config` (seeds 0..N-1), each building its data inside its own clock, one line per epoch."""
    results = []
    for seed in range(seeds):
        results += speedrun.race_seeds(config, [seed], label=config.recipe,
                                       on_epoch=lambda s, p: print(f"seed {s} {speedrun.format_point(p)}", flush=True))
        last = results[-1]
        print(f"seed {seed}: official val top-1 {percent(last.test_top1)}, top-5 {percent(last.test_top5)}; valid "
              f"top-1 {percent(last.val_top1)}; {last.seconds:.1f} s (setup {last.setup_seconds:.1f} s)", flush=True)
    return results


def markdown(record: dict, results: list, config) -> str:
    """The results page: where and how it ran, the summary with the gap, the claim, one row per run."""
    lines = [f"# Imagenette against fastai's leaderboard: recipe `{record['recipe']}`\n",
             f"Hardware: **{record['hardware']}**; load average {record['load_average_before']:.1f} before, "
             f"{record['load_average_after']:.1f} after; measured {record['started']}; {len(results)} run(s); "
             f"precision {results[-1].precision}. {config.model} at {config.image_size} px, {config.epochs} epochs, "
             f"batch {config.batch_size}, {config.optimizer} at {config.lr:g}. Scored on {record['split']}; "
             "`valid` (a fixed tenth of the official train) beside it.\n",
             "```", *speedrun.summary_lines(record["summary"]), "```", "", record["gap_line"], "",
             f"Claim `{imagenette.CLAIM}`: **{record['claim']['verdict']}**: {record['claim']['reason']}", "",
             "| seed | official val top-1 | official val top-5 | valid top-1 | valid top-5 | seconds | setup s | "
             "images/s |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.config.seed} | {percent(r.test_top1)} | {percent(r.test_top5)} | {percent(r.val_top1)} | "
              f"{percent(r.val_top5)} | {r.seconds:.0f} | {r.setup_seconds:.0f} | {r.images_per_second:.0f} |"
              for r in results]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argument_parser(__doc__)
    parser.set_defaults(profile="auto")  # the gpu profile's switches where CUDA is: 5 runs of resnet50d want a GPU
    parser.add_argument("--recipe", default="imagenette")
    parser.add_argument("--seeds", type=int, default=5, help="runs with seeds 0..N-1 (default 5, the leaderboard's)")
    args = parser.parse_args(argv)
    given = parse_assignments(args.param)
    check = resolve_profile(args.profile) in claims.CHECK_PROFILES  # smoke sizes: the script's check, not evidence
    if "data_dir" not in given:
        folder = SAMPLE_DATA_DIR if check else imagenette_or_skip("the leaderboard's figure is about Imagenette")
        if folder is None:
            return 0
        given["data_dir"] = str(folder)
    config = make_config(args.profile, {"smoke": IMAGENETTE_SMOKE}, **{"recipe": args.recipe, **given})
    hardware, load_before, started = machine.describe_hardware(), os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M")
    print(f"{args.recipe}: {config.model} at {config.image_size} px, {config.epochs} epochs, {args.seeds} run(s) on "
          f"{config.data_dir}; {hardware}; load average {load_before:.1f}", flush=True)
    results = race(config, args.seeds)
    summary = speedrun.seed_summary(results, target=imagenette.LEADERBOARD_TOP1)
    claim = imagenette.claim(summary, config, hardware)
    claims.record([claim], profile=args.profile)  # `workbook claims` lists it (a smoke run apart, as no evidence)
    record = {"recipe": args.recipe, "hardware": hardware, "started": started, "load_average_before": load_before,
              "load_average_after": os.getloadavg()[0], "on_imagenette": not check,
              "split": SAMPLE_SPLIT if check else imagenette.OFFICIAL_VAL,
              "leaderboard": {"top1": imagenette.LEADERBOARD_TOP1, "image_size": imagenette.LEADERBOARD_IMAGE_SIZE,
                              "epochs": imagenette.LEADERBOARD_EPOCHS, "runs": imagenette.LEADERBOARD_RUNS,
                              "entry": imagenette.LEADERBOARD_ENTRY},
              "gap": imagenette.gap(summary), "gap_line": imagenette.gap_line(summary, config, hardware),
              "summary": summary, "claim": {"verdict": claim.verdict, "reason": claim.reason},
              "seeds": [{"seed": r.config.seed, **r.row(), "val top-5": r.val_top5, "test top-5": r.test_top5,
                         "curve": r.curve} for r in results],
              "config": config.to_dict(), "versions": machine.runtime_versions()}
    out, stem = Path(args.out), imagenette.RESULT_STEM + ("" if args.recipe == "imagenette" else f"_{args.recipe}")
    out.mkdir(parents=True, exist_ok=True)
    write(out / f"{stem}.json", json.dumps(record, indent=2, default=str))
    page = markdown(record, results, config)
    write(out / f"{stem}.md", page)
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
