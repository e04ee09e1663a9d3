"""Where things live: the project root, the committed sample, the data cache, the runs folder,
and the real EuroSAT copy beside the project. A leaf: it imports nothing of the project, so
every module can ask for a path without pulling in datasets or the ledger.
"""
from __future__ import annotations

from pathlib import Path

SAMPLE_DIR = Path("data_samples") / "landcover-synth"  # the committed landcover-synth sample
CACHE_DIR = Path("data_cache")  # generated or downloaded data, pre-decoded caches (not committed)
RUNS_DIR = Path("runs")  # executed notebooks, checkpoints, evaluations, the ledger (not committed)


def project_root() -> Path:
    """The folder holding pyproject.toml (so a notebook kernel started in notebooks/ still
    writes to the project's runs/ folder); the current folder when there is none."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").exists() and (folder / "course_lib").is_dir():
            return folder
    return here


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
