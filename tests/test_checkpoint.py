"""Checkpoints: atomic writes, weights_only loading, refusal of arbitrary pickled objects."""
import errno
import io
import os
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from course_lib.models import checkpoint
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


@pytest.mark.slow
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


# --- failed saves leave nothing behind; a full disk is one line -----------------------------------

class DiskFullAfter(io.FileIO):
    """A file on a disk that fills up after `limit` bytes: writes then fail with ENOSPC."""

    def __init__(self, path, mode, limit=4096):
        super().__init__(path, mode.replace("b", ""))
        self.limit, self.written = limit, 0

    def write(self, data):
        if self.written + len(data) > self.limit:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written += len(data)
        return super().write(data)


def test_a_full_disk_is_one_line_leaves_no_temp_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint({"model": {"w": torch.ones(3)}}, tmp_path / "last.pt")
    previous = path.read_bytes()
    monkeypatch.setattr(checkpoint, "open", DiskFullAfter, raising=False)
    with pytest.raises(CheckpointError, match="no space left on the disk") as caught:
        save_checkpoint({"model": {"w": torch.randn(100_000)}}, path)
    assert "\n" not in str(caught.value) and "output_dir" in str(caught.value)
    assert caught.value.__context__ is None or caught.value.__suppress_context__  # no two-part traceback
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    assert path.read_bytes() == previous


def test_a_failure_during_fsync_or_rename_removes_the_temp_file(tmp_path, monkeypatch):
    def refuse(*args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", refuse)
    with pytest.raises(CheckpointError, match="cannot write the checkpoint .*Input/output error"):
        save_checkpoint({"model": {}}, tmp_path / "last.pt")
    assert list(tmp_path.iterdir()) == []


def test_the_next_save_removes_temp_files_of_killed_saves(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited
    host = checkpoint._host_tag()
    left_by_kill = [tmp_path / f".last.pt.{host}-{dead_pid}.tmp", tmp_path / f".last.pt.{dead_pid}.tmp"]
    alive = tmp_path / f".last.pt.{host}-{os.getppid()}.tmp"  # a live process may be saving right now
    other_host_recent = tmp_path / f".last.pt.elsewhere-{dead_pid}.tmp"
    other_host_old = tmp_path / f".last.pt.faraway-{dead_pid}.tmp"
    for file in [*left_by_kill, alive, other_host_recent, other_host_old]:
        file.write_bytes(b"half a checkpoint")
    hours_ago = time.time() - 2 * checkpoint.FOREIGN_TEMPORARY_SECONDS
    os.utime(other_host_old, (hours_ago, hours_ago))
    save_checkpoint({"model": {}}, tmp_path / "last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.pt", alive.name, other_host_recent.name])


@pytest.mark.slow
def test_a_save_killed_midway_leaves_a_temp_file_that_the_next_save_clears(tmp_path):
    """kill -9 during torch.save: no finally runs, so the next save must clear it."""
    script = ("import os, sys, torch\n"
              "from course_lib.models import checkpoint\n"
              "real_save = torch.save\n"
              "def dying_save(obj, handle):\n"
              "    handle.write(b'partial')\n"
              "    handle.flush()\n"
              "    os.kill(os.getpid(), 9)\n"
              "torch.save = dying_save\n"
              f"checkpoint.save_checkpoint({{'model': {{}}}}, {str(tmp_path / 'last.pt')!r})\n")
    process = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120)
    assert process.returncode == -9
    assert len(list(tmp_path.glob(".last.pt.*.tmp"))) == 1  # the fault: a temp file is left behind
    save_checkpoint({"model": {}}, tmp_path / "last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


# --- broken files say what they are -----------------------------------------------------------------

BROKEN_FILES = {
    "empty": (b"", "an empty file"),
    "text": (b"weights: see the shared drive\n", "a text file"),
    "lfs-pointer": (b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 46827520\n",
                    "git lfs pull"),
    "html": (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>...</body></html>",
             "download returned a web page"),
    "binary": (bytes(range(7, 200)), "not a zip/torch checkpoint"),
    "gzip": (b"\x1f\x8b\x08\x00" + bytes(40), "gzip"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN_FILES))
def test_a_file_that_is_not_a_checkpoint_says_what_it_is(tmp_path, kind):
    content, expected = BROKEN_FILES[kind]
    path = tmp_path / "last.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert expected in message and str(path) in message and "\n" not in message
    assert "pickled objects" not in message


@pytest.mark.slow
def test_cli_names_a_git_lfs_pointer_in_one_line(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(BROKEN_FILES["lfs-pointer"][0])
    process = subprocess.run([sys.executable, "-m", "course_lib", "eval", str(path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert process.returncode == 2
    assert process.stderr.strip().count("\n") == 0 and "git lfs pull" in process.stderr


def flip_a_bit(path, record_suffix="data/0", offset=400 * 4 + 3, bit=0x40):
    """Flip one bit of a stored tensor (by default the exponent of float 400 of the first storage)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(record_suffix))
    header = info.header_offset
    name_length, extra_length = struct.unpack("<HH", data[header + 26:header + 30])
    data[header + 30 + name_length + extra_length + offset] ^= bit
    path.write_bytes(bytes(data))


def test_a_flipped_bit_is_caught_by_the_crc_check(tmp_path):
    path = save_checkpoint({"model": {"w": torch.ones(1000)}}, tmp_path / "last.pt")
    flip_a_bit(path)
    # The fault: torch.load returns the damaged value without a word.
    assert torch.load(path, weights_only=True)["model"]["w"][400] == float("inf")
    with pytest.raises(CheckpointError, match="fails the CRC-32 check"):
        load_checkpoint(path)


def test_non_finite_weights_are_refused_naming_the_first_bad_tensor(tmp_path):
    weights = {"conv.weight": torch.ones(4, 3), "fc.bias": torch.tensor([0.0, float("nan"), float("inf")]),
               "fc.num_batches_tracked": torch.tensor(3)}
    path = save_checkpoint({"model": weights, "history": [{"loss": float("nan")}]}, tmp_path / "last.pt")
    with pytest.raises(CheckpointError, match=r"tensor model\.fc\.bias has 2 non-finite value\(s\) .* of 3"):
        load_checkpoint(path)
    state = load_checkpoint(path, check_finite=False)  # to inspect it on purpose
    assert torch.isnan(state["model"]["fc.bias"][1])
    finite = save_checkpoint({"model": {"w": torch.ones(2)}, "history": [{"loss": float("nan")}]},
                             tmp_path / "ok.pt")
    load_checkpoint(finite)  # a NaN in plain values (the history) is not a damaged weight


def test_config_digest_ignores_bookkeeping_only(tmp_path):
    config = tiny_config(tmp_path)
    digest = checkpoint.config_digest(config.to_dict())
    assert digest == checkpoint.config_digest(config.replace(output_dir="elsewhere", num_workers=1).to_dict())
    assert digest != checkpoint.config_digest(config.replace(lr=0.01).to_dict())
    assert digest != checkpoint.config_digest({**config.to_dict(), "classes": ["a"]})
