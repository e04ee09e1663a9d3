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


def test_mfu_uses_the_hardware_peak(monkeypatch):
    pass  # (import removed)

    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: 1e12)
    result = flops.model_flops_utilization(1e9, 100.0, "cpu")
    assert result["mfu"] == pytest.approx(0.1) and result["achieved_flops"] == pytest.approx(1e11)
