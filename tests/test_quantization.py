"""int8 and bf16: accuracy next to fp32 on the sample, weights four and two times smaller."""
import sys

import pytest
import torch
from conftest import tiny_config

from course_lib.config import SAMPLE_DATA_DIR
from course_lib.data.pipeline import build_datasets
from course_lib.deploy import export, quantization
from course_lib.engine import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    config = tiny_config(tmp_path_factory.mktemp("q"), data_dir=SAMPLE_DATA_DIR, image_size=32, epochs=2, max_steps=8)
    bundle = build_datasets(config)
    return train.fit(config, bundle=bundle, progress=False, verbose=False).model, config, bundle


@pytest.mark.slow
def test_int8_is_within_one_point_of_fp32_on_the_sample(trained):
    model, config, bundle = trained
    int8 = quantization.quantize_int8(model, export.image_batches(bundle.train, config, bundle.device_stage, 4))
    fp32_top1 = export.top1(model, bundle.val, config, bundle.device_stage)
    int8_top1 = export.top1(export.InferenceModel(int8, "int8"), bundle.val, config, bundle.device_stage)
    assert abs(int8_top1 - fp32_top1) <= 0.01 + 1e-9
    assert quantization.model_size_bytes(int8) < 0.35 * quantization.model_size_bytes(model)


def test_bf16_model_takes_and_returns_fp32(trained):
    model = trained[0]
    bf16 = quantization.BFloat16Model(model)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = bf16(images)
        assert out.dtype == torch.float32
        assert torch.allclose(out, model(images), atol=0.1, rtol=0.05)
    # BatchNorm's step counters stay int64: a little over half
    assert quantization.model_size_bytes(bf16) == pytest.approx(quantization.model_size_bytes(model) / 2, rel=0.01)
    assert next(model.parameters()).dtype == torch.float32  # the original is untouched


def test_calibration_needs_a_batch(trained):
    with pytest.raises(ValueError, match="at least one batch"):
        quantization.quantize_int8(trained[0], [])


@pytest.mark.slow
def test_without_torchao_int8_is_one_line_and_fp32_still_exports_and_loads(trained, monkeypatch, tmp_path):
    """torchao is the optional 'compress' extra the NGC containers leave out: the PT2E int8 flow says so in one
    line, notebook 13's quantization table keeps fp32 and bf16, and an fp32 .pt2 loads without it."""
    from course_lib.chapters import compress_and_deploy as study
    from course_lib.config import ConfigError

    model, config, bundle = trained
    monkeypatch.setitem(sys.modules, "torchao", None)  # as where it is not installed: every import of it fails
    assert quantization.torchao_missing() == quantization.TORCHAO_MISSING
    assert "pip install -e '.[compress]'" in quantization.TORCHAO_MISSING
    with pytest.raises(ConfigError, match="torchao is not installed"):
        quantization.quantize_int8(model, export.image_batches(bundle.train, config, bundle.device_stage, 1))
    images = export.image_batches(bundle.val, config, bundle.device_stage, 1)[0]
    loaded = export.pt2_model(export.export_pt2(model, images, tmp_path / "model.pt2"))
    assert export.max_difference(model, loaded, images) <= export.FP32_TOLERANCE
    # Notebook 13's rows without an int8 graph: fp32 and bf16 still measured, and the fp32 .pt2, the ONNX files and
    # onnxruntime's int8 (which needs no torchao) still served
    speed = {"batch_sizes": (2,), "repeats": 1, "warmup": 0}
    rows = [study.describe(model, bundle, config, speed, precision="fp32 (eager)"),
            study.describe(quantization.BFloat16Model(model), bundle, config, speed, flops_of=model,
                           peak_precision="bf16", precision="bf16 (eager)")]
    assert [row["precision"] for row in rows] == ["fp32 (eager)", "bf16 (eager)"] and rows[1]["val top-1"] > 0
    onnx_fp32 = export.export_onnx(model, images, tmp_path / "model.onnx")
    calibration = export.image_batches(bundle.train, config, bundle.device_stage, 1)
    onnx_int8 = export.quantize_onnx(onnx_fp32, tmp_path / "model-int8.onnx", calibration)
    served = [study.served_row("torch.export .pt2 fp32", loaded, model, tmp_path / "model.pt2", images, bundle, config,
                               speed),
              study.served_row("onnxruntime int8 (static QDQ)", export.onnx_model(onnx_int8), model, onnx_int8, images,
                               bundle, config, speed)]
    assert served[0]["max |logit diff|"] <= export.FP32_TOLERANCE and all(row["file MB"] > 0 for row in served)


def test_with_torchao_it_is_not_reported_missing():
    assert quantization.torchao_missing() is None  # the default venv installs the compress extra
