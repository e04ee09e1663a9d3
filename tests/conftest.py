from pathlib import Path

import pytest
import torch

from course_lib import ledger
from course_lib.config import make_config

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "data_samples" / "landcover-synth"


class TensorImages(torch.utils.data.Dataset):
    """Fixed random images whose mean depends on the label (so they are learnable), in memory."""

    def __init__(self, count, num_classes=4, size=16, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.arange(count) % num_classes
        self.images = torch.randn(count, 3, size, size, generator=generator) + self.targets.view(-1, 1, 1, 1) * 0.5

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], int(self.targets[index])



def tiny_config(tmp_path, **overrides):
    """A CPU config for a tiny model (timm's test_resnet at 16 px) that trains in about a second."""
    values = dict(model="test_resnet", batch_size=16, epochs=1, max_steps=0, lr=0.05, optimizer="sgd",
                  precision="off", device="cpu", num_workers=0, output_dir=str(tmp_path / "checkpoints"),
                  image_size=16)
    values.update(overrides)
    return make_config("smoke", **values)

@pytest.fixture(autouse=True)
def isolated_ledger(tmp_path, monkeypatch):
    """Every test writes to its own ledger, never to the project's runs/ledger.sqlite."""
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    monkeypatch.delenv(ledger.RUN_ID_ENV, raising=False)
    return path


@pytest.fixture
def eurosat_dir():
    """The real EuroSAT RGB folder (`paths.eurosat_dir`), or a skip with the reason."""
    from course_lib.paths import eurosat_dir

    folder = eurosat_dir()
    if folder is None:
        pytest.skip("no real EuroSAT folder (WORKBOOK_DATA, data_cache/eurosat/, ../shared/datasets/eurosat_rgb) "
                    "on this machine")
    return folder
