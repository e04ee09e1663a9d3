"""The build lock: one process builds a cache, a shard set or a downloaded layout while the others
(DDP ranks, a second notebook) wait for it, then find it built. POSIX file locks (fcntl).
"""
from __future__ import annotations

import contextlib
import shlex
from pathlib import Path

from course_lib.config import WorkbookError


class DamagedCacheError(WorkbookError, OSError):
    """A built cache or shard set whose files do not match what its index recorded (cut short by a
    full disk or a killed copy, or edited); the message names it and says to delete it."""


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
