"""After training, side by side: accuracy, size and CPU latency of the fp32 teacher, bf16, int8 (PT2E
compiled by Inductor, and onnxruntime's static int8), a pruned model (unstructured and channels) and a
distilled student. Notebook 13's studies, one seed, set up as the notebook sets them up
(`compress_and_deploy.setup`: the speed-run recipe's teacher on the whole training split, every
later fit on 1,000 images in the cpu profile), on EuroSAT when present (else the landcover-synth
sample, said in the output).

    .venv/bin/python benchmarks/bench_deploy.py [--profile cpu] [-p name=value ...]

Writes benchmarks/results/deploy.json and deploy.md with the hardware, its instruction sets and the load
average named. Waits while /tmp/workbook.quiet exists (someone is benchmarking). The teacher is the
checkpoint notebook 13 keeps in runs/checkpoints/13_compress_and_deploy/teacher (trained if missing).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _shared import argument_parser, write  # noqa: E402
from course_lib import machine  # noqa: E402
from course_lib.chapters import compress_and_deploy as study  # noqa: E402
from course_lib.config import parse_assignments  # noqa: E402
from course_lib.engine.cached_fit import cached_fit  # noqa: E402
from course_lib.measure.inventory import cpu_isa  # noqa: E402

COLUMNS = ["val top-1", "MB", "ms@1", "images/s@1", "ms@64", "images/s@64"]


def _wait_for_quiet() -> None:
    while Path("/tmp/workbook.quiet").exists():
        print("waiting: /tmp/workbook.quiet exists", flush=True)
        time.sleep(60)


def main(argv=None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--student", default=study.STUDENT_MODEL)
    args = parser.parse_args(argv)
    _wait_for_quiet()
    setup = study.setup(args.profile, **parse_assignments(args.param))
    config, data, bundle = setup.config, setup.data, setup.bundle
    print(data.line, flush=True)
    hardware, started, load_before = machine.describe_hardware(), time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]
    where = bundle.source if data.real else f"{bundle.source} (synthetic: no real data here)"
    print(f"{setup.teacher.model} on {where}; {hardware}; load average {load_before:.1f}", flush=True)
    quiet = dict(progress=False, verbose=False)
    fitted = cached_fit(setup.teacher, classes=bundle.classes, **quiet)
    teacher, how = fitted.model, fitted.how
    print(f"teacher: {how}", flush=True)
    rows = []
    quantized, int8_graph = study.quantization_study(teacher, config, bundle, compile_int8=True)
    rows += [{"model": setup.teacher.model, "variant": row["precision"], **row} for row in quantized]
    served = study.export_study(teacher, int8_graph, config, bundle, f"{config.output_dir}/exported")
    rows += [{"model": setup.teacher.model, "variant": row["served as"], **row, "MB": row["file MB"]}
             for row in served if row["served as"].startswith("onnxruntime")]
    _write(rows, Path(args.out), hardware, where, how, started, load_before, config)
    pruned = study.pruning_study(teacher, config, bundle, [0.7], [0.5], **quiet)
    rows += [{"model": setup.teacher.model, "variant": f"{row['method']} {row['requested']:.0%}, fine-tuned 1 epoch", **row}
             for row in pruned[1:]]
    _write(rows, Path(args.out), hardware, where, how, started, load_before, config)
    students = study.distillation_study(teacher, config.replace(model=args.student,
                                                                output_dir=f"{config.output_dir}/students"),
                                        bundle, [0], **quiet)
    rows += [{"model": row["student"], "variant": f"student, {row['method']}", **row} for row in students]
    _write(rows, Path(args.out), hardware, where, how, started, load_before, config, complete=True)
    return 0


def _write(rows, out: Path, hardware, where, how, started, load_before, config, complete: bool = False) -> None:
    """deploy.json and deploy.md with the rows so far (written after each study, so a long run that is
    stopped keeps what it measured)."""
    table = [{"model": row["model"], "variant": row["variant"], **{c: row.get(c) for c in COLUMNS}} for row in rows]
    isa = [name for name, present in cpu_isa().items() if present]
    record = {"hardware": hardware, "isa": isa, "started": started, "load_average_before": load_before,
              "load_average_after": os.getloadavg()[0], "data": where, "teacher": how, "rows": table,
              "config": config.to_dict(), "versions": machine.runtime_versions(), "complete": complete}
    out.mkdir(parents=True, exist_ok=True)
    write(out / "deploy.json", json.dumps(record, indent=2, default=str))
    lines = ["# After training: accuracy, size and CPU latency\n",
             f"Hardware: **{hardware}**, instruction sets {', '.join(isa) or 'unknown'}; load average "
             f"{load_before:.1f} before, {record['load_average_after']:.1f} after; measured {started}; data {where}; "
             f"{config.image_size} px; torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}.\n",
             "| model | variant | val top-1 | MB | ms @1 | images/s @1 | ms @64 | images/s @64 |",
             "|---|---|---|---|---|---|---|---|"]
    for row in table:
        lines.append(f"| {row['model']} | {row['variant']} | {row['val top-1']:.2%} | {row['MB']:.2f} | "
                     f"{row['ms@1']:.2f} | {row['images/s@1']:.0f} | {row['ms@64']:.1f} | {row['images/s@64']:.0f} |")
    if not complete:
        lines.append("\n(partial: the run stopped or is still going; the other studies are not measured yet)")
    write(out / "deploy.md", "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
