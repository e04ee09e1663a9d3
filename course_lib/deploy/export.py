"""Export a trained model and serve it outside the training code, checked against PyTorch.

- `torch.export` (https://docs.pytorch.org/docs/stable/export.html) captures the whole forward as
  one graph of ATen operators with a dynamic batch dimension; `torch.export.save` writes it as a
  `.pt2` file that `torch.export.load` runs without the model's Python class.
- ONNX through `torch.onnx.export(..., dynamo=True)` (the torch.export-based exporter; it needs
  onnxscript), run by onnxruntime (https://onnxruntime.ai), a runtime with its own CPU kernels.
  `--int8` quantizes the ONNX file with onnxruntime's static quantization (QDQ, int8 weights per
  channel, calibrated on training images): the int8 kernels are then the runtime's own, with no
  C++ compile step. The `.pt2` int8 artifact is PT2E's (`deploy.quantization`).

Every export is checked: the artifact's outputs on validation images against PyTorch's (fp32:
max absolute logit difference within FP32_TOLERANCE), its top-1 accuracy, and its latency
(`deploy.latency`). `export_checkpoint` does it for a `workbook train` checkpoint
(`workbook export CHECKPOINT --format onnx|pt2 [--int8]`) and writes a JSON beside the artifact.
Nothing is written over: the artifact (and int8's fp32 intermediate) is written to a temp file and
renamed into place once checked; an existing artifact is replaced only with `force`, and the
checkpoint being exported never.
"""
from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from course_lib.config import ConfigError
from course_lib.deploy import quantization
from course_lib.deploy.latency import speed_row

FORMATS = ("onnx", "pt2")
# Max |logit difference| allowed between an fp32 artifact and the PyTorch model: a different
# kernel order changes float32 sums in the last bits (about 1e-6 relative); 1e-3 absolute leaves
# room for logits of size ~10 and still catches any real mismatch (a wrong weight moves them by >0.1).
FP32_TOLERANCE = 1e-3


class InferenceModel(torch.nn.Module):
    """Any inference callable (an onnxruntime session, a loaded `.pt2` graph, a PT2E int8 graph) as a
    module taking and returning fp32 CPU tensors, so evaluation and timing treat it like the model.
    `train()`/`eval()` do not reach the wrapped graph (exported graphs refuse mode changes)."""

    def __init__(self, run, description: str):
        super().__init__()
        self._run = [run]  # in a list: not a submodule, so .eval() and .to() leave it alone
        self.description = description

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self._run[0](images)


def onnx_session(path: str | Path, threads: int = 0):
    """An onnxruntime CPU session for the ONNX file; `threads` = intra-op threads (0: one per core)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only: no per-node warnings in notebooks
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_model(path: str | Path) -> InferenceModel:
    session = onnx_session(path)
    input_name = session.get_inputs()[0].name

    def run(images: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(images.detach().float().cpu().numpy())  # onnxruntime wants contiguous NCHW
        return torch.from_numpy(session.run(None, {input_name: array})[0])

    return InferenceModel(run, f"onnxruntime {Path(path).name}")


def export_onnx(model: torch.nn.Module, example_images: torch.Tensor, path: str | Path) -> Path:
    """Write `model` as ONNX with a dynamic batch dimension (the dynamo exporter)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if example_images.shape[0] < 2:  # a dimension of size 1 would be specialised to a constant
        example_images = example_images.expand(2, *example_images.shape[1:]).contiguous()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (example_images.contiguous(),), str(path), dynamo=True, verbose=False,
                          dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},),
                          input_names=["images"], output_names=["logits"], external_data=False)
    return path


class _Calibration:
    """onnxruntime's CalibrationDataReader protocol over a list of image batches."""

    def __init__(self, batches, input_name: str):
        self._feeds = iter([{input_name: np.ascontiguousarray(b.float().numpy())} for b in batches])

    def get_next(self):
        return next(self._feeds, None)


def quantize_onnx(fp32_path: str | Path, int8_path: str | Path, calibration_batches) -> Path:
    """onnxruntime static int8 quantization of an ONNX file: QDQ format, int8 weights per output channel, uint8
    activations (the u8s8 scheme x86 VNNI kernels take), ranges from min/max over `calibration_batches`."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    session = onnx_session(fp32_path)
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR  # its advice to pre-process is a warning on the root logger
    try:
        quantize_static(str(fp32_path), str(int8_path),
                        _Calibration(list(calibration_batches), session.get_inputs()[0].name),
                        quant_format=QuantFormat.QDQ, per_channel=True, weight_type=QuantType.QInt8,
                        activation_type=QuantType.QUInt8, calibrate_method=CalibrationMethod.MinMax)
    finally:
        root.setLevel(level)
    return Path(int8_path)


def export_pt2(program_or_model, example_images: torch.Tensor, path: str | Path) -> Path:
    """Write a `.pt2` file: `model` exported with a dynamic batch (a PT2E int8 graph included)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(quantization.export_model(program_or_model, example_images), str(path))
    return path


def pt2_model(path: str | Path) -> InferenceModel:
    """A `.pt2` file loaded and run eagerly (no compile). int8 files need torchao imported, which
    registers the quantize/dequantize operators they call; fp32 files load without it."""
    missing = quantization.torchao_missing()  # imports torchao when it is here: the operators are registered
    try:
        graph = torch.export.load(str(path)).module()
    except Exception as error:
        if missing is None:
            raise
        raise ConfigError(f"{path} could not be loaded ({type(error).__name__}); if it is an int8 file: {missing}") \
            from error
    return InferenceModel(graph, f"torch.export {Path(path).name}")


def max_difference(reference: torch.nn.Module, candidate: torch.nn.Module, images: torch.Tensor) -> float:
    """Largest absolute difference between the two models' logits on `images`."""
    with torch.inference_mode():
        return float((reference(images).float() - candidate(images).float()).abs().max())


def top1(model: torch.nn.Module, dataset, config, device_stage=None) -> float:
    """Top-1 accuracy of `model` on `dataset` (fp32, on the CPU), through the evaluation code."""
    from course_lib.analysis.evaluation import predict

    labels, probabilities = predict(model, dataset, config.replace(device="cpu"), device_stage=device_stage)
    return float((probabilities.argmax(axis=1) == labels).mean())


def image_batches(dataset, config, device_stage=None, batches: int = 4) -> list[torch.Tensor]:
    """The first `batches` normalised fp32 batches of `dataset` on the CPU (calibration, checks)."""
    from course_lib.data.loaders import make_loader

    found = []
    for images, _ in make_loader(dataset, config.replace(device="cpu", num_workers=0), train=False, drop_last=False):
        found.append(device_stage(images, torch.device("cpu"), train=False) if device_stage else images.float())
        if len(found) == batches:
            break
    if not found:
        raise ValueError("the split is empty: no images to calibrate or check with")
    return found


def refuse_overwrite(artifact: Path, checkpoint_path: Path, force: bool) -> None:
    """One line (FileExistsError) when writing `artifact` would destroy a file: the checkpoint
    being exported (always), or an existing file (unless `force`)."""
    if artifact.resolve() == checkpoint_path.resolve():
        raise FileExistsError(f"--output {artifact} is the checkpoint being exported; choose another --output "
                              "(the default is beside the checkpoint, e.g. last.onnx)")
    if artifact.is_dir():
        raise FileExistsError(f"--output {artifact} is a folder; give a file path, e.g. --output {artifact / 'model.onnx'}")
    if artifact.exists() and not force:
        raise FileExistsError(f"{artifact} already exists; pass --force to replace it, or choose another --output")


def export_checkpoint(checkpoint_path: str | Path, export_format: str = "onnx", *, int8: bool = False,
                      output: str | Path | None = None, calibration_batches: int = 8, repeats: int = 5,
                      force: bool = False, **overrides) -> dict:
    """Export a `workbook train` checkpoint as `export_format` (onnx | pt2), int8 when asked; check it against the
    PyTorch model; measure its validation top-1 and CPU latency (median of `repeats`) at batch 1 and 64; write
    `<artifact>.json` beside it and a ledger row. `overrides`: Config values for the data. Returns the JSON content."""
    from course_lib import ledger, machine
    from course_lib.data.pipeline import build_datasets
    from course_lib.models import factory

    path, artifact = _export_paths(checkpoint_path, export_format, int8, output, repeats, force)
    suffix = "-int8" if int8 else ""
    started = time.perf_counter()
    saved = factory.load_trained(path)
    config = factory.checkpoint_config(saved, path, **{"device": "cpu", "num_workers": 0, "resume": False,
                                                       **overrides})
    model = factory.model_from_checkpoint(path)
    bundle = build_datasets(config)
    if list(bundle.classes) != list(saved["classes"]):
        raise ConfigError(f"{path} was trained on classes {saved['classes']} but {bundle.source} has "
                          f"{list(bundle.classes)}; pass -p data_dir=<the folder it was trained on>")
    check_images = image_batches(bundle.val, config, bundle.device_stage, batches=1)[0]
    served, difference = _write_checked(model, export_format, int8, artifact, check_images, lambda: image_batches(
        bundle.train, config, bundle.device_stage, calibration_batches))
    timing = dict(repeats=repeats, warmup=min(2, repeats))
    pytorch_top1 = top1(model, bundle.val, config, bundle.device_stage)
    served_top1 = top1(served, bundle.val, config, bundle.device_stage)
    report = {
        "artifact": str(artifact), "format": export_format, "int8": int8, "bytes": artifact.stat().st_size,
        "checkpoint": str(path), "model": config.model, "image_size": config.image_size, "classes": len(bundle.classes),
        "val_images": len(bundle.val), "top1": served_top1, "pytorch_top1": pytorch_top1,
        "max_abs_logit_difference": difference, "tolerance": None if int8 else FP32_TOLERANCE,
        "runtime": served.description + (" (eager: the int8 graph is a reference without torch.compile)"
                                          if int8 and export_format == "pt2" else ""),
        "latency": speed_row(served, config.image_size, **timing), "pytorch_latency": speed_row(model, config.image_size,
                                                                                               **timing),
        "hardware": machine.describe_hardware(), "torch_threads": torch.get_num_threads(),
    }
    artifact.with_name(artifact.name + ".json").write_text(json.dumps(report, indent=1) + "\n")
    ledger.record("export", f"{config.model}-{export_format}{suffix}", duration_seconds=time.perf_counter() - started,
                  parameters={**config.to_dict(), "format": export_format, "int8": int8, "artifact": str(artifact)},
                  metrics={k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return report


def _export_paths(checkpoint_path, export_format: str, int8: bool, output, repeats: int, force: bool) -> tuple:
    """(checkpoint, artifact) after every check that needs no work: the format, the checkpoint, the repeats, an
    artifact already there (`force`) and a folder that cannot be written, each in one line."""
    from course_lib.paths import check_writable

    if export_format not in FORMATS:
        raise ConfigError(f"--format {export_format!r} is not one of {', '.join(FORMATS)}")
    path = Path(checkpoint_path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist; train one with `workbook train`")
    if repeats < 1:
        raise ConfigError(f"--repeats must be at least 1 (timed runs per batch size), got {repeats}")
    suffix = "-int8" if int8 else ""
    artifact = Path(output) if output else path.with_name(f"{path.stem}{suffix}.{export_format}")
    refuse_overwrite(artifact, path, force)  # before any work: nothing is lost, no time is spent
    check_writable(artifact.parent.absolute(), "--output another path")  # relative to the working folder, as artifact
    return path, artifact


def _write_checked(model, export_format: str, int8: bool, artifact: Path, check_images, calibration) -> tuple:
    """Export `model` to `artifact` (int8: calibrated on `calibration()`'s batches), check the served model's logits
    against PyTorch's on `check_images` and rename it into place only once checked. (served model, max difference)."""
    from course_lib.models.checkpoint import temporary_path, written_atomically

    artifact.parent.mkdir(parents=True, exist_ok=True)
    with written_atomically(artifact) as temporary:
        if export_format == "onnx":
            if int8:  # the fp32 intermediate has a temp name too: an existing <stem>-fp32.onnx is left alone
                fp32_file = temporary_path(artifact.with_name(artifact.stem + "-fp32.onnx"))
                try:
                    export_onnx(model, check_images, fp32_file)
                    quantize_onnx(fp32_file, temporary, calibration())
                finally:
                    fp32_file.unlink(missing_ok=True)
            else:
                export_onnx(model, check_images, temporary)
            served = onnx_model(temporary)  # the session holds the model: the rename does not disturb it
        else:
            source = quantization.quantize_int8(model, calibration()) if int8 else model
            export_pt2(source, check_images, temporary)
            served = pt2_model(temporary)
        difference = max_difference(model, served, check_images)
        if not int8 and difference > FP32_TOLERANCE:
            raise RuntimeError(f"the exported {export_format} model's logits differ from PyTorch's by {difference:.2e} "
                               f"(> {FP32_TOLERANCE}); the export is wrong, do not serve it")
    return served, difference
