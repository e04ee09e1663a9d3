"""FLOP counting for MFU: a linear layer's training FLOPs have a closed form."""
import pytest
import torch

from course_lib.measure import flops, peak


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3 * 4 * 4, 5, bias=False)

    def forward(self, images):
        return self.fc(images.flatten(1))


def test_training_flops_of_a_linear_layer():
    # forward 2*in*out per image; backward only the weight gradient (the images need none): 2*in*out.
    assert flops.training_flops_per_image(Linear(), image_size=4) == pytest.approx(4 * 48 * 5)


@pytest.mark.parametrize("groups", [1, 64])
def test_a_grouped_convolution_counts_its_forward_and_both_gradients(groups):
    """Forward 2*outputs*(in/groups)*k*k; backward the same again for the input's gradient and for the
    weights' (torch's own counter treats the weights' gradient as a dense convolution: 64x too much
    for a depthwise one)."""
    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 64, 1, bias=False)
            self.conv = torch.nn.Conv2d(64, 64, 3, padding=1, groups=groups, bias=False)

        def forward(self, images):
            return self.conv(self.stem(images)).mean((2, 3))

    stem = 2 * 64 * 3 * 8 * 8
    conv = 2 * 64 * (64 // groups) * 9 * 8 * 8
    # the stem's input needs no gradient: its backward is the weights' gradient only
    assert flops.training_flops_per_image(Conv(), image_size=8) == pytest.approx(2 * stem + 3 * conv)


def test_mfu_uses_the_hardware_peak(monkeypatch):
    pass  # (import removed)

    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: 1e12)
    result = flops.model_flops_utilization(1e9, 100.0, "cpu")
    assert result["mfu"] == pytest.approx(0.1) and result["achieved_flops"] == pytest.approx(1e11)


def test_with_mfu_adds_a_column_per_row_precision(monkeypatch):
    import pandas as pd

    peaks = {"fp32": 1e12, "bf16": 4e12}  # by the dtype names of peak.mfu_peak's rule
    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: peaks[dtype])
    table = pd.DataFrame({"precision": ["off", "bf16", "off"], "images/s": [100.0, 100.0, float("nan")],
                          "note": ["a", "b", "c"]})
    result = flops.with_mfu(table, Linear(), 4, "cpu", precision="precision")
    per_image = 4 * 48 * 5
    assert list(result.columns) == ["precision", "images/s", "MFU", "note"]
    assert result.MFU[0] == pytest.approx(per_image * 100 / 1e12)
    assert result.MFU[1] == pytest.approx(per_image * 100 / 4e12)
    assert result.MFU[2] is None or result.MFU[2] != result.MFU[2]  # no speed, no MFU
