"""Training checkpoints: written atomically (temp file, fsync, rename) so a crash never leaves a half-written file, and
read with `torch.load(weights_only=True)`, which refuses pickled code objects
(https://pytorch.org/docs/stable/generated/torch.load.html).

A checkpoint is a dict of tensors and plain values: model, optimizer, scheduler, scaler and EMA state, the config as a
dict, the class names and the per-epoch history.

What can go wrong is said in one line (`CheckpointError`): a failed save removes its temp file (and the next save
removes those of processes killed mid-save), a full disk is named as such, and a file that is not a checkpoint says what
it is (empty, a git-lfs pointer, a web page, text). Loading checks the zip records' CRC-32 (a bit flip on disk) and, by
default, that every floating tensor is finite.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import socket
import time
import zipfile
from pathlib import Path

import torch

from course_lib.config import ConfigError
from course_lib.paths import process_alive

FORMAT = "workbook-checkpoint-v1"
LAST_NAME = "last.pt"  # the checkpoint `resume` continues from
BEST_NAME = "best.pt"  # the checkpoint of the epoch with the highest validation top-1 (save_best)
PREVIOUS_NAME = "prev.pt"  # the checkpoint last.pt replaced: one epoch earlier, kept in case last.pt is bad
# Temp files of another machine sharing the folder count as stale only after this long (seconds):
# their process cannot be asked whether it is alive, and no save takes an hour.
FOREIGN_TEMPORARY_SECONDS = 3600
# `.<name>.<host>-<pid>.tmp`, and the older `.<name>.<pid>.tmp`.
_TEMPORARY = re.compile(r"^\.(?P<name>.+?)\.(?:(?P<host>[A-Za-z0-9_]+)-)?(?P<pid>\d+)\.tmp$")
_ZIP_MAGIC = b"PK\x03\x04"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_saving: set[Path] = set()  # temp files this process is writing right now


class CheckpointError(ConfigError):
    """A checkpoint that cannot or must not be loaded; the message names the file and the fix."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:160] if text else type(error).__name__


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname()) or "host"


def temporary_path(path: Path) -> Path:
    """Where a save of `path` writes before its atomic rename; `remove_stale_temporaries` knows the name."""
    return path.with_name(f".{path.name}.{_host_tag()}-{os.getpid()}.tmp")


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temp files of saves that never finished (a kill -9 or power loss mid-save) in
    `folder`: those of processes on this machine that are gone, and those of other machines
    older than FOREIGN_TEMPORARY_SECONDS. Returns what was removed."""
    folder = Path(folder)
    removed = []
    for candidate in folder.glob(".*.tmp"):
        match = _TEMPORARY.match(candidate.name)
        if not match or candidate in _saving:
            continue
        pid, host = int(match["pid"]), match["host"]
        if host is None or host == _host_tag():
            stale = pid == os.getpid() or not process_alive(pid)  # our own pid: not in _saving, so left over
        else:
            try:
                stale = time.time() - candidate.stat().st_mtime > FOREIGN_TEMPORARY_SECONDS
            except FileNotFoundError:
                continue
        if stale:
            with contextlib.suppress(FileNotFoundError):  # another process removed it first
                candidate.unlink()
                removed.append(candidate)
    return removed


@contextlib.contextmanager
def written_atomically(path: Path):
    """Yield the temp file to write `path`'s new content into, renamed to `path` when the block ends (readers see the
    old file or the new one, never half); on failure the temp file is removed and `path` left as it was."""
    remove_stale_temporaries(path.parent)
    temporary = temporary_path(path)
    _saving.add(temporary)
    try:
        yield temporary
        os.replace(temporary, path)  # atomic on POSIX and Windows when on the same filesystem
    finally:
        _saving.discard(temporary)
        temporary.unlink(missing_ok=True)  # still there only when the write failed


def _disk_full(error: BaseException) -> bool:
    """torch's zip writer turns a failed write into a RuntimeError whose context is the OSError."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _DISK_FULL:
            return True
        error = error.__cause__ or error.__context__
    return False


def save_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """Write `state` to `path` atomically: readers see the old file or the new one, never half.
    A failure removes the temp file and leaves the previous checkpoint as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(f"cannot create the checkpoint folder {path.parent} ({_first_line(error)}); "
                              "set output_dir to a folder you can write") from None
    try:
        with written_atomically(path) as temporary, open(temporary, "wb") as handle:
            torch.save({"format": FORMAT, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
    except (OSError, RuntimeError) as error:
        if _disk_full(error):
            free = shutil.disk_usage(path.parent).free / 1e6
            raise CheckpointError(f"no space left on the disk holding {path.parent} while writing {path.name} "
                                  f"({free:.0f} MB free); free some space or set output_dir to another disk "
                                  f"(the previous {path.name}, if any, is unchanged)") from None
        if isinstance(error, OSError):
            raise CheckpointError(f"cannot write the checkpoint {path} ({_first_line(error)}); "
                                  "set output_dir to a folder you can write") from None
        raise
    return path


def identify(path: Path) -> str | None:
    """What a file that cannot be a torch checkpoint is, from its first bytes, as a one-line
    description with the fix; None when it looks like a zip (torch's format) or a legacy pickle."""
    size = path.stat().st_size
    if size == 0:
        return "an empty file (0 bytes): the save or the copy was cut short; use another copy or retrain"
    with open(path, "rb") as handle:
        head = handle.read(512)
    if head.startswith(_ZIP_MAGIC) or head.startswith(b"\x80"):  # torch's zip format; a legacy pickle
        return None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"version https://git-lfs"):
        return ("a git-lfs pointer (a small text file standing for the real weights): run `git lfs pull` "
                "in the repository to fetch them")
    if text[:15].lower().startswith((b"<!doctype html", b"<html")) or b"<html" in text.lower():
        return ("an HTML page, not weights: the download returned a web page (a login, error or 'virus scan' "
                "page); download the file itself again")
    if head.startswith(b"\x1f\x8b"):
        return "a gzip-compressed file: decompress it (gunzip) and load the result"
    if len(head) > 8 and head[8:10] == b'{"' and int.from_bytes(head[:8], "little") < size:
        return "a safetensors file: load it with safetensors.torch.load_file, not as a workbook checkpoint"
    try:
        decoded = head.decode("utf-8")
    except UnicodeDecodeError:
        decoded = None
    if decoded is not None and all(c.isprintable() or c in "\r\n\t" for c in decoded):
        first = decoded.strip().splitlines()[0][:60] if decoded.strip() else ""
        return f"a text file, not a checkpoint (it starts {first!r}); check the path"
    return (f"not a zip/torch checkpoint (it starts with bytes {head[:8].hex(' ')}); check the path, "
            "or re-save the weights with torch.save")


def _verify_zip(path: Path) -> None:
    """The CRC-32 of every record (torch.load itself does not check them, so a flipped bit in a
    weight loads silently)."""
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CheckpointError(f"{path} is not a readable torch checkpoint (damaged zip: {_first_line(error)}); "
                              "use another copy or retrain") from None
    if broken is not None:
        raise CheckpointError(f"{path} is damaged: its record {broken} fails the CRC-32 check (a flipped bit on "
                              "disk or in a copy); use another copy or retrain")


def first_non_finite(state, prefix: str = "") -> tuple[str, int, int] | None:
    """(name, non-finite count, size) of the first floating tensor in `state` (nested dicts,
    lists, tuples) holding NaN or inf; None when all are finite."""
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() or state.is_complex():
            finite = torch.isfinite(state)
            if not bool(finite.all()):
                return prefix, int((~finite).sum()), state.numel()
        return None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    for key, value in items:
        found = first_non_finite(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None


def load_checkpoint(path: str | os.PathLike, map_location="cpu", *, check_finite: bool = True) -> dict:
    """The checkpoint dict ("model", "config", "classes", "epoch", "history", ...) of tensors and plain values only;
    a file that is not one, fails its CRC check or (`check_finite`) holds NaN/inf is a CheckpointError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    what = identify(path)
    if what is not None:
        raise CheckpointError(f"{path} is {what}")
    with open(path, "rb") as handle:
        if handle.read(4) == _ZIP_MAGIC:
            _verify_zip(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"refusing {path}: it holds pickled objects other than tensors and plain values "
                              f"({_first_line(error)}); only load files you trust, re-saved as state_dicts") from None
    except (RuntimeError, EOFError, ValueError, KeyError, IndexError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"{path} is not a readable torch checkpoint ({type(error).__name__}: "
                              f"{_first_line(error)}); use another copy or retrain") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a workbook checkpoint (no 'model' entry); "
                              "save with course_lib.models.checkpoint.save_checkpoint")
    if check_finite:
        bad = first_non_finite(state)
        if bad is not None:
            name, count, size = bad
            raise CheckpointError(f"{path}: tensor {name} has {count} non-finite value(s) (NaN or inf) of {size}; "
                                  "the weights are damaged (a diverged run or corruption): use an earlier "
                                  "checkpoint, or load_checkpoint(..., check_finite=False) to inspect it")
    return state


# Config fields that say where and how fast a run went, not what it learned: a checkpoint trained
# with other values of these is the same model, so `config_digest` leaves them out.
BOOKKEEPING_FIELDS = ("output_dir", "resume", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                      "tensorboard")


# Config fields added after checkpoints were first cached under digests, with the value that trains as before: at
# that value a field is left out, so a new field does not orphan every model a reader has already trained.
LATER_FIELDS = {"rotation": 0.0, "sync_batchnorm": False, "muon_lr": 0.015, "lookahead_steps": 0,
                "lookahead_alpha": 0.5, "whiten_stem": False, "activation": "", "tta_selective": 0.0}


def config_digest(values: dict, ignore=BOOKKEEPING_FIELDS) -> str:
    """A 12-hex-digit SHA-1 of `values` (a Config's `to_dict()` plus all else that decides the weights) without the
    `ignore` fields (and `LATER_FIELDS` at their old value): the name under which a checkpoint is found and reused."""
    kept = {key: value for key, value in values.items()
            if key not in ignore and not (key in LATER_FIELDS and value == LATER_FIELDS[key])}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]
