"""The build lock: one process builds a cache, a shard set or a downloaded layout while the others
(DDP ranks, a second notebook) wait for it, then find it built. POSIX file locks (fcntl).

Beside it, what every build shares: a fresh staging folder to build in, clearing the partials of builds whose process
is gone (`staging_folder`), renamed into place when whole or removed when the build fails (`built_in_staging`), disk
blocks reserved before a memmap writes into them (`allocate`), and the one line for a full disk (`disk_full`)."""
from __future__ import annotations

import contextlib
import errno
import glob
import os
import shlex
import shutil
from pathlib import Path

from course_lib.config import WorkbookError
from course_lib.paths import process_alive

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DamagedCacheError(WorkbookError, OSError):
    """A built cache or shard set whose files do not match what its index recorded (cut short by a
    full disk or a killed copy, or edited); the message names it and says to delete it."""


class DiskFullError(WorkbookError, OSError):
    """No room on the disk for what a build must write: the message gives the size needed, the room left and
    the fix."""


def damaged(folder: Path, what: str) -> DamagedCacheError:
    return DamagedCacheError(f"cache {folder} is damaged ({what}); delete it (rm -r {shlex.quote(str(folder))}) "
                             "and the next run rebuilds it")


@contextlib.contextmanager
def exclusive_build(folder: Path):
    """Hold an exclusive lock on `<folder>.lock` while building `folder`, so DDP ranks (or two
    notebooks) asking for the same cache or shards wait for one builder instead of racing.
    POSIX file locks (fcntl); where there is none, no lock."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(folder.with_name(folder.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def staging_folder(out_dir: Path) -> Path:
    """An empty `<out_dir>.partial-<pid>` to build `out_dir` in. Under `exclusive_build` the partials of earlier
    builds are left from processes that are gone (a kill -9): removed first, or they would fill the disk for good;
    one whose process still runs (no file locks) is left alone, and a link is removed as a link, never entered."""
    for leftover in map(Path, glob.glob(glob.escape(str(out_dir)) + ".partial-*")):
        pid = leftover.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or (int(pid) != os.getpid() and process_alive(int(pid))):
            continue
        if leftover.is_symlink() or not leftover.is_dir():
            leftover.unlink(missing_ok=True)
        else:
            shutil.rmtree(leftover, ignore_errors=True)
    staging = out_dir.with_name(f"{out_dir.name}.partial-{os.getpid()}")
    staging.mkdir(parents=True)
    return staging


@contextlib.contextmanager
def built_in_staging(out_dir: Path, what: str, needed):
    """Yield a fresh `staging_folder(out_dir)`, renamed to `out_dir` when the block ends; whatever stops the build (a
    bad image, a full disk, Ctrl-C) removes it, a full disk as one DiskFullError (`needed()`: the bytes `what` takes)."""
    staging = staging_folder(out_dir)
    try:
        yield staging
    except BaseException as error:  # no half-built folder stays behind to fill the disk
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            raise disk_full(staging, needed(), what) from None
        raise
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)


STORAGE_FIX = "free some space, or train with storage=files (reads the image files, builds nothing)"


def disk_full(path: Path, needed: int, what: str, fix: str = STORAGE_FIX) -> DiskFullError:
    """The one line for a build that found no room: how much `what` needs, how much the disk holds free, and
    `fix`."""
    # the folder the reader knows: a staging folder (`staging_folder`) is gone by the time the line is read
    where = next((folder for folder in (path.parent, *path.parent.parents) if ".partial-" not in folder.name),
                 path.parent)
    try:
        room = f", {shutil.disk_usage(where).free / 2**20:,.1f} MiB free there"
    except OSError:
        room = ""
    return DiskFullError(f"no room on the disk for {what}: {needed / 2**20:,.1f} MiB needed at {where}{room}; {fix}")


def allocate(path: Path, size: int, what: str) -> None:
    """Create `path` with `size` bytes reserved on the disk (only sized without posix_fallocate, as on macOS): a memmap
    over a sparse file faults with SIGBUS (exit 135, no message) when the disk fills, this is one DiskFullError."""
    with open(path, "wb") as handle:
        try:
            if hasattr(os, "posix_fallocate") and size:
                os.posix_fallocate(handle.fileno(), 0, size)
            else:
                handle.truncate(size)
        except OSError as error:
            if error.errno in DISK_FULL:
                raise disk_full(path, size, what) from None
            raise
