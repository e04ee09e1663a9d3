"""Training checkpoints: written atomically (temp file, fsync, rename) so a crash never leaves
a half-written file, and read with `torch.load(weights_only=True)`, which refuses pickled
code objects (https://pytorch.org/docs/stable/generated/torch.load.html).

A checkpoint is a dict of tensors and plain values: model, optimizer, scheduler, scaler and
EMA state, the config as a dict, the class names and the per-epoch history.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from course_lib.config import ConfigError

FORMAT = "workbook-checkpoint-v1"
LAST_NAME = "last.pt"  # the checkpoint `resume` continues from


class CheckpointError(ConfigError):
    """A checkpoint that cannot or must not be loaded; the message names the file and the fix."""


def save_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """Write `state` to `path` atomically: readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        torch.save({"format": FORMAT, **state}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)  # atomic on POSIX and Windows when on the same filesystem
    return path


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """The checkpoint dict ("model", "config", "classes", "epoch", "history", ...).
    Only tensors and plain values are accepted: a file holding other pickled objects is refused."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"refusing {path}: it holds pickled objects other than tensors and plain values "
                              f"({first_line[:160]}); only load files you trust, re-saved as state_dicts") from None
    except (RuntimeError, EOFError) as error:
        raise CheckpointError(f"{path} is not a readable torch checkpoint ({str(error).splitlines()[0][:160]})") \
            from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a workbook checkpoint (no 'model' entry); "
                              "save with course_lib.models.checkpoint.save_checkpoint")
    return state
