"""After training, side by side: accuracy, size and CPU latency of the fp32 teacher, bf16, int8 (PT2E
compiled by Inductor, and onnxruntime's static int8), a pruned model (unstructured 70% and channels 50%, each
fine-tuned 1 epoch) and a distilled student against a labels-only one. The calls of notebook 13's cells, one
seed, set up as the notebook sets them up (`compress_and_deploy.setup`: the speed-run recipe's teacher on the
whole training split, the students and fine-tunes on `setup.converged_data`), on EuroSAT when present (else
the landcover-synth sample, said in the output).

    .venv/bin/python benchmarks/bench_deploy.py [--profile cpu] [-p name=value ...]

Writes benchmarks/results/deploy.json and deploy.md with the hardware, its instruction sets and the load
average named. Waits while /tmp/workbook.quiet exists (someone is benchmarking). The teacher is the
checkpoint notebook 13 keeps in runs/checkpoints/13_compress_and_deploy/teacher (trained if missing).
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _shared import argument_parser, write  # noqa: E402
from course_lib import machine, paths  # noqa: E402
from course_lib.chapters import compress_and_deploy as study  # noqa: E402
from course_lib.config import parse_assignments  # noqa: E402
from course_lib.deploy import export, pruning, quantization  # noqa: E402
from course_lib.engine import train  # noqa: E402
from course_lib.engine.cached_fit import cached_fit  # noqa: E402
from course_lib.engine.distillation import Distiller  # noqa: E402
from course_lib.measure.inventory import cpu_isa  # noqa: E402

COLUMNS = ["val top-1", "MB", "ms@1", "images/s@1", "ms@64", "images/s@64"]
SPARSITY, CHANNEL_RATIO, FINETUNE_EPOCHS = 0.7, 0.5, 1  # one point of each of notebook 13's pruning sweeps
TEMPERATURE, WEIGHT = 4.0, 0.9  # notebook 13's distillation: weight * T^2 * KL + (1 - weight) * CE


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
    config, data, bundle, speed = setup.config, setup.data, setup.bundle, setup.speed
    print(data.line, flush=True)
    hardware, started, load_before = machine.describe_hardware(), time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]
    where = bundle.source if data.real else f"{bundle.source} (synthetic: no real data here)"
    print(f"{setup.teacher.model} on {where}; {hardware}; load average {load_before:.1f}", flush=True)
    quiet = dict(progress=False, verbose=False)
    fitted = cached_fit(setup.teacher, classes=bundle.classes, **quiet)
    teacher, how = fitted.model, fitted.how
    print(f"teacher: {how}", flush=True)

    def save(rows, complete=False):
        _write(rows, Path(args.out), hardware, where, how, started, load_before, config, complete)

    rows = [{"model": setup.teacher.model, "variant": row["precision"], **row}
            for row in _quantized(teacher, setup)]
    rows += [{"model": setup.teacher.model, "variant": row["served as"], **row, "MB": row["file MB"]}
             for row in _served_by_onnxruntime(teacher, setup)]
    save(rows)
    rows += [{"model": setup.teacher.model, "variant": f"{row['method']} {row['requested']:.0%}, fine-tuned "
                                                       f"{FINETUNE_EPOCHS} epoch", **row}
             for row in _pruned(teacher, setup, **quiet)]
    save(rows)
    rows += [{"model": row["student"], "variant": f"student, {row['method']}", **row}
             for row in _students(teacher, setup, args.student, **quiet)]
    save(rows, complete=True)
    return 0


def _quantized(teacher, setup) -> list[dict]:
    """Notebook 13's section 3: fp32 and bf16 eager, then the PT2E int8 graph compiled by Inductor (always
    compiled here, whatever the profile; without torchao fp32 and bf16 only)."""
    config, bundle, speed = setup.config, setup.bundle, setup.speed
    rows = [study.describe(teacher, bundle, config, speed, precision="fp32 (eager)"),
            study.describe(quantization.BFloat16Model(teacher), bundle, config, speed, flops_of=teacher,
                           peak_precision="bf16", precision="bf16 (eager)")]
    if (missing := quantization.torchao_missing()) is not None:
        print(missing, flush=True)
        return rows
    calibration = export.image_batches(bundle.train, config, bundle.device_stage, setup.calibration_batches)
    int8_graph = quantization.quantize_int8(teacher, calibration)
    rows.append(study.int8_row(int8_graph, teacher, bundle, config, speed, "int8 PT2E reference (not compiled)"))
    started = time.perf_counter()
    compiled_int8 = torch.compile(int8_graph)
    with torch.no_grad():  # the first calls compile (one graph per batch shape class)
        compiled_int8(calibration[0][:2])
    rows.append(study.int8_row(int8_graph, teacher, bundle, config, speed, "int8 PT2E + torch.compile",
                               compiled=compiled_int8, **{"compile s": time.perf_counter() - started}))
    return rows


def _served_by_onnxruntime(teacher, setup) -> list[dict]:
    """Notebook 13's section 4, the onnxruntime rows: fp32 ONNX and its static QDQ int8 quantization."""
    config, bundle = setup.config, setup.bundle
    folder = paths.resolve_path(f"{config.output_dir}/exported")
    images = export.image_batches(bundle.val, config, bundle.device_stage, batches=1)[0]
    calibration = export.image_batches(bundle.train, config, bundle.device_stage, setup.calibration_batches)
    onnx_fp32 = export.export_onnx(teacher, images, folder / "model.onnx")
    files = {"onnxruntime fp32": onnx_fp32,
             "onnxruntime int8 (static QDQ)": export.quantize_onnx(onnx_fp32, folder / "model-int8.onnx", calibration)}
    return [study.served_row(label, export.onnx_model(path), teacher, path, images, bundle, config, setup.speed)
            for label, path in files.items()]


def _pruned(teacher, setup, **fit_options) -> list[dict]:
    """Notebook 13's section 2 at one sparsity and one channel ratio: each prune of the teacher fine-tuned
    (a tenth of the learning rate) on the students' data, made permanent and measured."""
    config, bundle = setup.config, setup.bundle
    # two validation images: what prune_channels traces
    example = export.image_batches(bundle.val, config, bundle.device_stage, batches=1)[0][:2]
    finetune = config.replace(epochs=FINETUNE_EPOCHS, lr=config.lr / 10, warmup_epochs=0.0, ema_decay=0.0)
    rows = []
    for method, amount in (("unstructured L1", SPARSITY), ("channels L1", CHANNEL_RATIO)):
        pruned_model, settings = copy.deepcopy(teacher), finetune.replace(
            output_dir=f"{config.output_dir}/pruned-{method[:4]}-{amount}")
        if method == "unstructured L1":
            pruning.prune_unstructured(pruned_model, amount)
            # precision=auto times steps on a deep copy, and a masked weight (computed each forward) cannot be copied
            settings = settings.replace(precision="off") if settings.precision == "auto" else settings
        else:
            pruning.prune_channels(pruned_model, amount, example)
        result = train.fit(settings, bundle=setup.converged_data, model=pruned_model, **fit_options)
        rows.append(study.pruned_row(pruning.make_permanent(result.model), bundle, config, setup.speed, method, amount))
    return rows


def _students(teacher, setup, student: str, **fit_options) -> list[dict]:
    """Notebook 13's section 1 with one seed: the same student trained on labels only and distilled from
    the teacher (only the loss differs)."""
    config, seed = setup.config, setup.seeds[0]
    student_config = config.replace(model=student, epochs=setup.student_epochs or config.epochs,
                                    output_dir=f"{config.output_dir}/students")
    rows = []
    distilled = f"distilled (T={TEMPERATURE:g}, weight {WEIGHT:g})"
    for method, distiller in (("labels only", None), (distilled, Distiller(teacher, TEMPERATURE, WEIGHT))):
        run_config = student_config.replace(seed=seed, output_dir=f"{student_config.output_dir}/"
                                                                  f"{'kd' if distiller else 'labels'}-{seed}")
        result = train.fit(run_config, bundle=setup.converged_data, teacher=distiller, **fit_options)
        rows.append(study.describe(result.model, setup.converged_data, run_config, setup.speed, student=student,
                                   method=method, seed=seed))
    return rows


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
