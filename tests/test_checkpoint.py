"""Checkpoints: atomic writes, weights_only loading, refusal of arbitrary pickled objects."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_lib.models.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]


class Payload:
    """Stands for any object whose unpickling could run code."""

    def __reduce__(self):
        return (print, ("this would run on load",))


def test_checkpoint_holding_an_arbitrary_pickled_object_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "extra": Payload()}, path)
    with pytest.raises(CheckpointError, match="refusing"):
        load_checkpoint(path)
    # The CLI turns it into one line, exit code 2.
    process = subprocess.run([sys.executable, "-m", "course_lib", "train", "--profile", "smoke",
                              "-p", f"checkpoint={path}", "-p", "model=test_resnet"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert process.returncode == 2
    assert process.stderr.strip().count("\n") == 0 and "refusing" in process.stderr


def test_checkpoint_is_written_atomically_and_round_trips(tmp_path):
    path = save_checkpoint({"model": {"w": torch.ones(3)}, "config": {}, "classes": ["a"]}, tmp_path / "x.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.pt"]  # no temp file left behind
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(3))
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "junk.pt")
