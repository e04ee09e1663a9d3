"""Where things live: the project root, the committed sample, the data cache, the runs folder,
and the real EuroSAT copy beside the project. A leaf: it imports nothing of the project, so
every module can ask for a path without pulling in datasets or the ledger.
"""
from __future__ import annotations

import os
from pathlib import Path

SAMPLE_DIR = Path("data_samples") / "landcover-synth"  # the committed landcover-synth sample
CACHE_DIR = Path("data_cache")  # generated or downloaded data, pre-decoded caches (not committed)
RUNS_DIR = Path("runs")  # executed notebooks, checkpoints, evaluations, the ledger (not committed)


PACKAGE_DIR = Path(__file__).resolve().parent  # course_lib/ itself


class NotWritableError(OSError):
    """A folder the run must write to cannot be created or written; the message says which and why."""


def _is_project(folder: Path) -> bool:
    return (folder / "pyproject.toml").exists() and (folder / "course_lib").is_dir()


def project_root() -> Path:
    """The folder holding pyproject.toml (so a notebook kernel started in notebooks/ still
    writes to the project's runs/ folder). Outside any project, the project this package was
    installed from (the folder above course_lib/, for a source checkout or an editable install),
    so `workbook train --profile smoke` finds the committed sample from any folder; the current
    folder when the package is installed without its project."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if _is_project(folder):
            return folder
    if _is_project(PACKAGE_DIR.parent):
        return PACKAGE_DIR.parent
    return here


def check_writable(folder: str | os.PathLike) -> Path:
    """Create `folder` (relative paths: under the project root) and write and remove a probe file
    in it, so a run that will write there fails in its first second, not after an epoch.
    Returns the folder; raises NotWritableError (one line: the folder, the reason, the fix)."""
    target = resolve_path(folder)
    probe = target / f".write-probe-{os.getpid()}"
    try:
        target.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"probe")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        reason = error.strerror or str(error)
        if isinstance(error, FileExistsError) or (target.exists() and not target.is_dir()):
            reason = "a file of that name is in the way"
        elif isinstance(error, NotADirectoryError):
            reason = "part of the path is a file, not a folder"
        failure = NotWritableError(f"cannot write to {target} ({reason}); choose a folder you can write "
                                   "(e.g. -p output_dir=...) or fix its permissions")
        failure.errno = error.errno
        raise failure from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return target


def resolve_path(path: str | Path) -> Path:
    """Relative paths are relative to the project root, so notebooks (run from notebooks/)
    and the CLI agree."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else project_root() / candidate


def eurosat_shared_dir() -> Path | None:
    """The real EuroSAT RGB folder beside the project (../shared/datasets/eurosat_rgb), if present."""
    candidate = project_root().parent / "shared" / "datasets" / "eurosat_rgb"
    return candidate if (candidate / "train").is_dir() else None


def choose_data(profile: str | None, data_dir: str | None = None) -> dict:
    """The one rule for "which data does this run train on", as Config overrides: an explicit
    `data_dir` (an ImageFolder) wins; else the real EuroSAT tiles when they are beside the project,
    except in the smoke profile (CI-sized: it stays on the committed sample); else {} (the
    profile's own data, landcover-synth)."""
    if data_dir:
        return {"dataset": "imagefolder", "data_dir": str(data_dir)}
    eurosat = eurosat_shared_dir()
    if profile != "smoke" and eurosat is not None:
        return {"dataset": "imagefolder", "data_dir": str(eurosat)}
    return {}
