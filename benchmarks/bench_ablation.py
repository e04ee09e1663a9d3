"""Notebook 12's ablation as a benchmark (issue 48, point 2): the full speed-run recipe against the recipe with
ingredients taken out or turned on, seed by seed, on the fixed carve-out of `train`, at the profile's ablation sizes.

    .venv/bin/python benchmarks/bench_ablation.py --ingredients "+ torch.compile (default mode)" --warmup
    .venv/bin/python benchmarks/bench_ablation.py --ingredients "+ Muon (conv weights); ReLU (vs GELU)" --seeds 5 --recipe-budget

Each seed races the full recipe and then every chosen ingredient (`time_to_accuracy.ablate` with one seed), so a
change in the machine's load hits both sides alike. `--warmup` races the full recipe and each chosen ingredient once before the
seeds (seed 1000), outside the table: for `torch.compile` that race pays the cold compile inside its clock, and the seeds
after it find inductor's cache on disk, so their seconds hold the tracing and a warm compile only; both are
written. `--recipe-budget` trains every row at the recipe's own sizes (its epochs, batch and learning rate, the whole
split but the carve-out, scored on the whole carve-out): the converged ablation, where an accuracy verdict means
something. Writes benchmarks/results/ablation_<name>.json and .md (hardware and load average named) after every seed,
so a run stopped early keeps the seeds it finished. Besides the table's top-1 with the recipe's TTA, the markdown
gives each row's single-view top-1 paired by seed and its seconds to 97% single view. In the smoke
profile it runs on the committed sample (a check of the script); in other profiles it needs real EuroSAT.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path

from _shared import argument_parser, eurosat_or_skip, write  # noqa: E402 (puts the project on sys.path)
from course_lib import machine  # noqa: E402
from course_lib.chapters import time_to_accuracy  # noqa: E402
from course_lib.config import parse_assignments  # noqa: E402

WARMUP_SEED = 1000  # a seed no measured race uses


def slug(ingredients: list[str]) -> str:
    """A file name for a set of ingredients: `+ torch.compile (default mode)` -> `torch-compile-default-mode`."""
    return "_".join(re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") for name in ingredients)[:80]


def markdown_table(table) -> list[str]:
    """The ablation table (`time_to_accuracy.ablation_table`) as markdown rows, top-1 in percent."""
    columns = ["val top-1 mean", "val top-1 std", "seeds", "seconds mean", "images/s mean", "change vs full",
               "change low", "change high", "verdict"]
    lines = ["| row | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, row in table.iterrows():
        cells = []
        for column in columns:
            value = row.get(column)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("-")
            elif column.startswith(("val top-1", "change")):
                cells.append(f"{100 * value:+.1f}" if column.startswith("change") else f"{100 * value:.1f}%")
            elif isinstance(value, float):
                cells.append(f"{value:.0f}" if "images/s" in column else f"{value:.1f}")
            else:
                cells.append(str(value))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--ingredients", required=True,
                        help="names of time_to_accuracy.ABLATIONS separated by ; (or , where no name holds one), all or auto")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--warmup", action="store_true", help="race each ingredient once before the seeds")
    parser.add_argument("--ablation-images", type=int, default=-1,
                        help="training images per run (-1: the profile's ablation size, 0: the recipe's)")
    parser.add_argument("--recipe-budget", action="store_true",
                        help="the recipe's epochs, batch and images, scored on the whole carve-out")
    args = parser.parse_args(argv)
    if args.profile != "smoke" and eurosat_or_skip("the ablation scores real EuroSAT tiles") is None:
        return 0
    setup = time_to_accuracy.setup(args.profile)
    ingredients = setup.ingredients(args.ingredients)
    unknown = [name for name in ingredients if name not in time_to_accuracy.ABLATIONS]
    if unknown:
        print(f"unknown ingredient {unknown[0]!r}; choose from: {', '.join(time_to_accuracy.ABLATIONS)}")
        return 2
    config, per_class = (setup.recipe.replace(validation_from="train"), 0) if args.recipe_budget else \
        time_to_accuracy.ablation_config(setup, images=args.ablation_images)
    config = config.replace(**parse_assignments(args.param)) if args.param else config
    hardware, load_before, started = machine.describe_hardware(), os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M")
    print(f"ablation of {', '.join(ingredients)}: {config.model}, {config.epochs} epochs of "
          f"{config.max_train_images or 'all'} images, batch {config.batch_size}, {per_class or 'all'} validation images per class of the carve-out; "
          f"{args.seeds} seed(s); {hardware}; load average {load_before:.1f}", flush=True)
    warmups = []
    if args.warmup:
        for ablation in time_to_accuracy.ablate(config, [WARMUP_SEED], ingredients, validation_per_class=per_class,
                                                progress=False)[1:]:
            warmups.append({"ingredient": ablation.ingredient, "seconds": ablation.results[0].seconds,
                            "images_per_second": ablation.results[0].images_per_second})
            print(f"warm-up {ablation.ingredient}: {warmups[-1]['seconds']:.1f} s", flush=True)
    runs, changes = {}, {}
    for seed in range(args.seeds):
        for ablation in time_to_accuracy.ablate(config, [seed], ingredients, validation_per_class=per_class,
                                                progress=False):
            runs.setdefault(ablation.ingredient, []).extend(ablation.results)
            changes[ablation.ingredient] = ablation.changes
            print(f"seed {seed} {ablation.ingredient}: {ablation.results[-1].val_top1:.2%} "
                  f"({ablation.results[-1].single_view_top1:.2%} single view) in "
                  f"{ablation.results[-1].seconds:.1f} s", flush=True)
        report(args, setup, config, per_class, ingredients, runs, changes, warmups,
               dict(hardware=hardware, load_before=load_before, started=started, seeds=seed + 1))
    return 0


def single_view_rows(runs: dict) -> list[str]:
    """Per row: single-view top-1 (mean, change paired by seed with its interval) and seconds to 97% single view
    (mean over the seeds that reached it, and how many did): the figures the speed-run's target is set in."""
    import pandas as pd
    from course_lib.analysis import statistics

    frame = pd.DataFrame([{"row": name, "seed": r.config.seed, "top1": r.single_view_top1}
                          for name, results in runs.items() for r in results])
    compared = statistics.compare_variants(frame, "top1", baseline="full recipe", variant="row")
    lines = ["| row | top-1, 1 view, mean | change vs full | change low | change high | verdict | s to 97% (1 view) "
             "| reached |", "|---|---|---|---|---|---|---|---|"]
    for name, results in runs.items():
        row = compared.loc[name]
        change = [f"{100 * row[c]:+.2f}" if c in row and not pd.isna(row[c]) else "-"
                  for c in ("delta", "delta low", "delta high")]
        reached = [s for s in (r.time_to(0.97) for r in results) if s is not None]
        seconds = f"{sum(reached) / len(reached):.1f}" if reached else "-"
        verdict = row["verdict"] if "verdict" in row and isinstance(row["verdict"], str) else "-"
        lines.append(f"| {name} | {100 * row['mean']:.2f}% | " + " | ".join(change) +
                     f" | {verdict} | {seconds} | {len(reached)} of {len(results)} |")
    return lines


def report(args, setup, config, per_class: int, ingredients: list[str], runs: dict, changes: dict, warmups: list,
           facts: dict) -> None:
    """Writes the table of the seeds so far, json and markdown, and prints the markdown."""
    ablations = [time_to_accuracy.Ablation(name, changes[name], results) for name, results in runs.items()]
    table = time_to_accuracy.ablation_table(ablations, device=setup.device)
    hardware, load_before, started, seeds = facts["hardware"], facts["load_before"], facts["started"], facts["seeds"]
    record = {"ingredients": ingredients, "hardware": hardware, "started": started,
              "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
              "split": f"carve-out of train, {per_class or 'all'} validation images per class",
              "config": config.to_dict(), "warmups": warmups, "versions": machine.runtime_versions(),
              "runs": [{"ingredient": a.ingredient, "seed": r.config.seed, **r.row()}
                       for a in ablations for r in a.results],
              "table": json.loads(table.reset_index().to_json(orient="records"))}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"ablation_{slug(ingredients)}"
    write(out / f"{name}.json", json.dumps(record, indent=2, default=str))
    lines = [f"# Ablation: {', '.join(ingredients)}\n",
             f"Hardware: **{hardware}**; load average {load_before:.1f} before, {record['load_average_after']:.1f} "
             f"after; measured {started}; {config.model}, {config.epochs} epochs of {config.max_train_images or 'all'} images at "
             f"batch {config.batch_size}; top-1 with {config.tta_views}-view TTA on the {record['split']}; seeds "
             f"0-{seeds - 1}, each racing every row in turn. Seconds include the final prediction; images/s are "
             "the last epoch's.\n", *markdown_table(table),
             "\nSingle view (the speed-run's target is set in it), paired by seed with the full recipe:\n",
             *single_view_rows(runs)]
    lines += [f"\nWarm-up race before the seeds (seed {WARMUP_SEED}, not in the table): " + "; ".join(
        f"{w['ingredient']} {w['seconds']:.1f} s, {w['images_per_second']:.0f} images/s" for w in warmups)] \
        if warmups else []
    write(out / f"{name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
