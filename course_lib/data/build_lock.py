"""The build lock: one process builds a cache, a shard set or a downloaded layout while the others
(DDP ranks, a second notebook) wait for it, then find it built. POSIX file locks (fcntl).
"""
from __future__ import annotations

import contextlib
from pathlib import Path


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
