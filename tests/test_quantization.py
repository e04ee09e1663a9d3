"""int8 and bf16: accuracy next to fp32 on the sample, weights four and two times smaller."""
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
