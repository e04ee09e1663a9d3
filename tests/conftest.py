import os
from pathlib import Path

import pytest

from course_lib import ledger

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "data_samples" / "landcover-synth"


@pytest.fixture(autouse=True)
def isolated_ledger(tmp_path, monkeypatch):
    """Every test writes to its own ledger, never to the project's runs/ledger.sqlite."""
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    monkeypatch.delenv(ledger.RUN_ID_ENV, raising=False)
    return path


@pytest.fixture
def eurosat_dir():
    """The real EuroSAT RGB folder, or a skip with the reason."""
    from course_lib.data import eurosat_shared_dir

    folder = eurosat_shared_dir()
    if folder is None:
        pytest.skip("real EuroSAT folder ../shared/datasets/eurosat_rgb is absent on this machine")
    return folder
