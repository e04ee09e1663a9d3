"""Two recipes raced side by side to 97% on EuroSAT (issue 48, point 1): the ratio of their times, with its interval.

    .venv/bin/python benchmarks/bench_race.py --recipes speedrun,NEW --seeds 5
    .venv/bin/python benchmarks/bench_race.py --recipes speedrun,NEW --seeds 3 --validation-from train

NEW is an entry of `config.RECIPES` (a recipe is chosen on the carve-out first, then reported on `valid`).

Seed by seed, each recipe races in turn (the first recipe first on even seeds, second on odd ones), so a change
in the machine's load hits both alike; every race decodes its own data (the pre-decoded cache is removed before
it), and its clock runs from the first decoded image to the final prediction, test-time augmentation included:
the race's seconds. Nothing is compiled or warmed up outside a clock. The speed-up is the first recipe's seconds
to 97% single view over the second's, paired by seed (`statistics.paired_ratio_interval`: the ratio of the
medians, a t interval on the logs of the per-seed ratios), over the seeds where both reached 97%. Each recipe's
compute-only ceiling is measured in the same invocation, after its first race (which settles its precision) and
after the last seed: training steps of its model at its final image size and precision on one batch already in
memory, no data path; the report gives each recipe's images/s (the last epoch's) as a share of it, so machines
can be compared.

Scored on EuroSAT's `valid` split by default (reporting; no choice was made on it), `--validation-from train`
for the fixed carve-out (choosing). Writes benchmarks/results/race_<first>_vs_<second>.json and .md (hardware
and load average named) after every seed. In the smoke profile it races on the committed sample (a check of the
script); in other profiles it needs real EuroSAT and otherwise skips, saying why. `--report-from RACE.json` writes
a finished race's report again from its json with the code as it stands (a line added to the report after the race).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from _shared import ROOT, argument_parser, eurosat_data, write  # noqa: E402 (puts the project on sys.path)
from bench_engine_data import compute_ceiling  # noqa: E402
from course_lib import devices, machine  # noqa: E402
from course_lib.analysis import statistics  # noqa: E402
from course_lib.config import RECIPES, Config, make_config, parse_assignments  # noqa: E402
from course_lib.data import cache  # noqa: E402
from course_lib.engine import speedrun  # noqa: E402

TARGET = 0.97
CEILING_STEPS = 12


def ceiling(config, result) -> float:
    """Images/s of training steps of `config`'s model at its final image size and the precision its race used, on
    one batch in memory (`bench_engine_data.compute_ceiling`)."""
    return compute_ceiling(config.replace(precision=result.precision), result.num_classes,
                           devices.resolve_device(config.device), CEILING_STEPS)


def seed_pairs(results: dict, first: str, second: str) -> list[tuple]:
    """(first's result, second's result) of each seed both recipes raced, matched by seed, in the first's order."""
    theirs = {result.config.seed: result for result in results[second]}
    return [(mine, theirs[mine.config.seed]) for mine in results[first] if mine.config.seed in theirs]


def speedup(results: dict, first: str, second: str) -> dict | None:
    """The first recipe's seconds to 97% over the second's, paired by seed, where both reached it (None: fewer
    than 2 such seeds)."""
    pairs = [(a.time_to(TARGET), b.time_to(TARGET)) for a, b in seed_pairs(results, first, second)]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if len(pairs) < 2:
        return None
    return statistics.paired_ratio_interval([a for a, _ in pairs], [b for _, b in pairs])


def top1_change(results: dict, first: str, second: str) -> dict | None:
    """The second recipe's final single-view top-1 minus the first's, in points, paired by seed (None: fewer than 2
    seeds raced by both), the issue's "no lower than today's"."""
    pairs = seed_pairs(results, first, second)
    if len(pairs) < 2:
        return None
    return statistics.paired_difference([100 * b.single_view_top1 for _, b in pairs],
                                        [100 * a.single_view_top1 for a, _ in pairs])


def report(out: Path, recipes: list[str], configs: dict, results: dict, ceilings: dict, facts: dict) -> list[str]:
    """Writes the race so far (json and markdown) and returns the markdown lines; `facts` may carry the load average
    after the race (a report written again from its json), else it is read now."""
    first, second = recipes
    ratio, change = speedup(results, first, second), top1_change(results, first, second)
    summaries = {name: speedrun.seed_summary(results[name]) for name in recipes}
    record = {"load_average_after": os.getloadavg()[0], **facts, "recipes": recipes, "target": TARGET,
              "speedup": ratio, "top1_change": change, "ceilings": ceilings, "summaries": summaries,
              "configs": {name: configs[name].to_dict() for name in recipes},
              "seeds": [{"recipe": name, "seed": r.config.seed, **r.row(), "val top-5": r.val_top5,
                         "test top-5": r.test_top5, "curve": r.curve}
                        for name in recipes for r in results[name]], "versions": machine.runtime_versions()}
    name = f"race_{first}_vs_{second}"
    write(out / f"{name}.json", json.dumps(record, indent=2, default=str))
    seeds = len(results[second])
    lines = [f"# Side-by-side race on EuroSAT: `{first}` against `{second}`\n",
             f"Hardware: **{facts['hardware']}**; load average {facts['load_average_before']:.1f} before, "
             f"{record['load_average_after']:.1f} after; measured {facts['started']}; {seeds} seed(s), each racing "
             f"both recipes in turn; scored on {facts['split']}. Every clock includes decoding and the final "
             "prediction with the recipe's TTA; nothing is compiled or warmed up outside it.\n"]
    if ratio:
        lines.append(f"**Speed-up to {TARGET:.0%} single view: {ratio['ratio']:.2f}x [{ratio['low']:.2f}, "
                     f"{ratio['high']:.2f}]** (`{first}`'s seconds over `{second}`'s, paired by seed, "
                     f"{ratio['pairs']} seed(s) where both reached it; 95% t interval on the logs).\n")
    else:
        lines.append(f"Speed-up to {TARGET:.0%}: not measurable (fewer than 2 seeds where both reached it).\n")
    if change:
        verdict = {1: "higher", -1: "lower", 0: "within noise"}[change["beyond"]]
        lines.append(f"Final top-1, single view, `{second}` minus `{first}`: {change['delta']:+.2f} points "
                     f"[{change['low']:+.2f}, {change['high']:+.2f}], paired by seed over {change['runs']} seeds: "
                     f"{verdict}.\n")
    for recipe in recipes:
        measured = ceilings.get(recipe) or []
        shares = [r.images_per_second / c for r in results[recipe] for c in measured]
        share = f"{min(shares):.0%}-{max(shares):.0%}" if shares else "-"
        shown = ", ".join(f"{c:.0f}" for c in measured) or "-"
        lines += [f"### `{recipe}`: {configs[recipe].model}, {configs[recipe].epochs} epochs, batch "
                  f"{configs[recipe].batch_size}\n", "```", *speedrun.summary_lines(summaries[recipe]), "```", "",
                  f"Compute-only ceiling (after its first race, after the last seed): {shown} images/s; the races' last-epoch images/s are "
                  f"{share} of it.\n", "| seed | top-1, 1 view | top-1, TTA | s to 97% | seconds | images/s |",
                  "|---|---|---|---|---|---|"]
        for r in results[recipe]:
            reached = r.time_to(TARGET)
            lines.append(f"| {r.config.seed} | {r.single_view_top1:.2%} | {r.val_top1:.2%} | "
                         f"{f'{reached:.0f}' if reached is not None else '-'} | {r.seconds:.0f} | "
                         f"{r.images_per_second:.0f} |")
        lines.append("")
    write(out / f"{name}.md", "\n".join(lines) + "\n")
    return lines


def report_again(path: Path) -> list[str]:
    """The report of a race already run, written again from its json with this code (`--report-from`): the race's
    configs, seeds, curves, ceilings and facts as they were, only the derived lines and fields new."""
    record = json.loads(path.read_text())
    configs = {name: Config(**record["configs"][name]) for name in record["recipes"]}
    results = {name: [] for name in record["recipes"]}
    for run in record["seeds"]:
        results[run["recipe"]].append(speedrun.RaceResult(
            run["label"], configs[run["recipe"]].replace(seed=run["seed"]), run["curve"], run["setup s"], run["seconds"],
            run["val top-1"], run["test top-1"], run["precision"], run["images/s"], val_top5=run.get("val top-5"),
            test_top5=run.get("test top-5")))
    facts = {key: record[key] for key in ("hardware", "load_average_before", "load_average_after", "started", "split")}
    return report(path.parent, record["recipes"], configs, results, record["ceilings"], facts)


def main(argv=None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--recipes", help="two recipes of config.RECIPES, the baseline first")
    parser.add_argument("--report-from", type=Path, help="a race's json: write its report again (no race is run)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument("--validation-from", default="folder", choices=("folder", "train"),
                        help="folder: score EuroSAT's valid split (reporting); train: a fixed carve-out (choosing)")
    args = parser.parse_args(argv)
    if args.report_from:
        print("\n".join(report_again(args.report_from)))
        return 0
    recipes = [name.strip() for name in (args.recipes or "").split(",") if name.strip()]
    if len(recipes) != 2 or len(set(recipes)) != 2 or not set(recipes) <= set(RECIPES):
        print(f"--recipes takes two different recipes of {', '.join(RECIPES)}, got {args.recipes!r}")
        return 2
    data = eurosat_data(args.profile, "the race is about real EuroSAT tiles")
    if data is None:
        return 0
    configs = {name: make_config(args.profile, **{**data, "recipe": name, "validation_from": args.validation_from,
                                                  **parse_assignments(args.param)}) for name in recipes}
    facts = {"hardware": machine.describe_hardware(), "load_average_before": os.getloadavg()[0],
             "started": time.strftime("%Y-%m-%d %H:%M"),
             "split": speedrun.split_label(configs[recipes[0]], real_data=bool(data))}
    print(f"race of {' against '.join(recipes)}: {args.seeds} seed(s); {facts['hardware']}; load average "
          f"{facts['load_average_before']:.1f}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, ceilings, lines = {name: [] for name in recipes}, {name: [] for name in recipes}, []
    for seed in range(args.seeds):
        for name in recipes if seed % 2 == 0 else recipes[::-1]:
            removed = cache.remove_caches(configs[name].data_dir or ROOT, configs[name].image_size)
            result = speedrun.race(configs[name].replace(seed=seed), label=name, progress=False, verbose=False)
            results[name].append(result)
            if not ceilings[name]:  # the ceiling before the first race counts from here on (its precision known)
                ceilings[name].append(ceiling(configs[name], result))
            reached = result.time_to(TARGET)
            print(f"seed {seed} {name}: {result.single_view_top1:.2%} (1 view), {result.val_top1:.2%} (TTA), "
                  f"97% at {f'{reached:.1f} s' if reached is not None else 'never'}, {result.seconds:.1f} s in all "
                  f"({removed} cache(s) removed first)", flush=True)
        if seed == args.seeds - 1:
            for name in recipes:
                ceilings[name].append(ceiling(configs[name], results[name][0]))
        lines = report(out, recipes, configs, results, ceilings, facts)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
