"""Time to accuracy on EuroSAT (issue 11's targets): the speed-run recipe raced against the clock.

    .venv/bin/python benchmarks/bench_speedrun.py                        # recipe speedrun, 600 s budget
    .venv/bin/python benchmarks/bench_speedrun.py --recipe best --budget 0   # no budget: the whole recipe

Targets on 2 CPU cores: 97% validation top-1 within 600 s of wall clock, decoding included; the `best`
recipe at 98.6% or more from scratch. Writes benchmarks/results/speedrun_<recipe>.json and .md (hardware
and load average named) and a ledger row of kind "speedrun". Skips, saying why, without EuroSAT.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _shared import eurosat_or_skip  # noqa: E402
from course_lib import ledger  # noqa: E402
from course_lib.config import make_config, parse_assignments  # noqa: E402
from course_lib.engine import speedrun  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="speedrun")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds; 0 = no budget")
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    eurosat = eurosat_or_skip("the targets are about real EuroSAT tiles")
    if eurosat is None:
        return 0
    config = make_config(args.profile, dataset="imagefolder", data_dir=str(eurosat), recipe=args.recipe,
                         **parse_assignments(args.param))
    load_before, started = os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M")
    hardware = ledger.describe_hardware()
    print(f"{args.recipe}: {config.model}, {config.epochs} epochs, budget {args.budget or 'none'}; {hardware}; "
          f"load average {load_before:.1f}", flush=True)
    result = speedrun.race(config, budget_seconds=args.budget or None, label=args.recipe, progress=False,
                           on_epoch=lambda p: print(f"  {p['seconds']:7.1f} s epoch {p['epoch']:3d} val top-1 "
                                                    f"{p['val_top1']:.2%} {p['images_per_second']:.0f} images/s",
                                                    flush=True))
    summary = result.row()
    record = {"recipe": args.recipe, "hardware": hardware, "started": started, "load_average_before": load_before,
              "load_average_after": os.getloadavg()[0], "budget_seconds": args.budget, "summary": summary,
              "curve": result.curve, "config": config.to_dict(), "versions": ledger.runtime_versions()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"speedrun_{args.recipe}.json").write_text(json.dumps(record, indent=2, default=str))
    lines = [f"# Time to accuracy on EuroSAT: recipe `{args.recipe}`\n",
             f"Hardware: **{hardware}**; load average {load_before:.1f} before, {record['load_average_after']:.1f} "
             f"after; measured {started}; budget {args.budget or 'none'} s; precision {result.precision}.\n",
             f"Final validation top-1 (with {config.tta_views} test-time view(s)): **{result.val_top1:.2%}** after "
             f"{result.seconds:.0f} s (setup {result.setup_seconds:.0f} s, decoding and caching included)"
             + (f"; held-out test top-1 {result.test_top1:.2%}" if result.test_top1 is not None else "") + ".\n",
             "| milestone | seconds |", "|---|---|"]
    for level in speedrun.MILESTONES:
        reached = result.time_to(level)
        lines.append(f"| {level:.0%} validation top-1 | {f'{reached:.0f}' if reached is not None else 'not reached'} |")
    lines += ["", "| seconds | epoch | val top-1 | images/s |", "|---|---|---|---|"]
    lines += [f"| {p['seconds']:.0f} | {p['epoch']} | {p['val_top1']:.2%} | {p['images_per_second']:.0f} |"
              for p in result.curve]
    (out / f"speedrun_{args.recipe}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
