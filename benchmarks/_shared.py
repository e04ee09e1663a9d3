"""What the benchmark scripts share: the command-line arguments every one takes (profile, config
overrides, results folder) and the skip, with its reason, when no real EuroSAT (or Imagenette) folder is found."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from course_lib import paths  # noqa: E402


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A parser with --profile (default cpu), -p/--param NAME=VALUE (any Config field) and --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    return parser


def eurosat_or_skip(why: str) -> Path | None:
    """The real EuroSAT folder, found in the order every run looks (`paths.eurosat_dir`: WORKBOOK_DATA,
    data_cache/eurosat/, ../shared/datasets/eurosat_rgb), or None after printing one line saying the
    benchmark is skipped and why."""
    folder = paths.eurosat_dir()
    if folder is None:
        print(f"skipped: no EuroSAT in {paths.DATA_ENV}, data_cache/eurosat/ or ../shared/datasets/eurosat_rgb "
              f"(`{paths.GET_REAL_DATA}` fetches it); {why}")
    return folder


def eurosat_data(profile: str, why: str) -> dict | None:
    """The Config values that race on real EuroSAT ({} in the smoke profile: the committed sample, a check of the
    script, not a measurement), or None, after `eurosat_or_skip`'s line, where none is found."""
    if profile == "smoke":
        return {}
    eurosat = eurosat_or_skip(why)
    return None if eurosat is None else {"dataset": "imagefolder", "data_dir": str(eurosat)}


def imagenette_or_skip(why: str) -> Path | None:
    """data_cache/imagenette/ where `workbook data get imagenette` lays it out (`paths.imagenette_dir`), or None
    after printing one line saying the benchmark is skipped, how to get the data, and why it needs it."""
    folder = paths.imagenette_dir()
    if folder is None:
        print(f"skipped: no Imagenette in {paths.CACHE_DIR}/imagenette/ (`{paths.GET_IMAGENETTE}` fetches it, or "
              f"give -p data_dir=FOLDER with train/ valid/ test/); {why}")
    return folder


def portable(text: str) -> str:
    """`text` with this checkout's absolute paths made relative to the project: committed results name a
    dataset by its name or a path relative to the project, never a folder of the machine that made them
    (the project's root becomes a relative path, its parent `..`)."""
    root = str(ROOT)
    return text.replace(root + "/", "").replace(root, ".").replace(str(ROOT.parent) + "/", "../")


def write(path: Path, text: str) -> None:
    """Write a results file (`portable` paths)."""
    Path(path).write_text(portable(text))

