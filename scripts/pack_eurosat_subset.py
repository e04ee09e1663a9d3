#!/usr/bin/env python3
"""Copy a fixed part of EuroSAT RGB into data_cache/eurosat_slot/ for a GPU slot that takes at most
64 MiB of the project (README, "Running on a short offline GPU slot"): the first `--train-per-class`
images of each class of train by file number (`<Class>_<n>.jpg`, n ascending), every image of valid,
the JPEG bytes unchanged, and SUBSET.json saying which, for gpu-check's speed-run part to report.

    python scripts/pack_eurosat_subset.py [--source FOLDER] [--out data_cache/eurosat_slot]
                                          [--train-per-class 1000] [--max-mib 52]

The default is 10,000 of the 18,900 training images (1,000 of each class) and the 4,050 valid
images: about 46 MiB, leaving room for the project's own 3 MiB under the 64.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

NUMBER = re.compile(r"_(\d+)\.jpg$", re.IGNORECASE)
RULE = "the first {n} images of each class of train by file number, all of valid"


def by_number(path: Path) -> tuple[int, str]:
    found = NUMBER.search(path.name)
    return (int(found.group(1)) if found else sys.maxsize, path.name)


def choose(source: Path, train_per_class: int) -> dict[str, list[Path]]:
    """{"train": [...], "valid": [...]} of the files to carry (valid whole; train capped per class)."""
    chosen = {}
    for split in ("train", "valid"):
        folder = source / split
        if not folder.is_dir():
            raise SystemExit(f"pack_eurosat_subset: {folder} is not a folder; give --source the EuroSAT folder "
                             "with train/ and valid/")
        files = []
        for class_folder in sorted(p for p in folder.iterdir() if p.is_dir()):
            images = sorted(class_folder.glob("*.jpg"), key=by_number)
            files += images[:train_per_class] if split == "train" else images
        chosen[split] = files
    return chosen


def pack(source: Path, out: Path, train_per_class: int = 1000, max_mib: float = 52.0) -> dict:
    """Copy the chosen files to `out` (refusing an existing `out` and a set over `max_mib`)."""
    chosen = choose(source, train_per_class)
    total = sum(path.stat().st_size for files in chosen.values() for path in files)
    if total > max_mib * 2**20:
        raise SystemExit(f"pack_eurosat_subset: {total / 2**20:.1f} MiB is over --max-mib {max_mib:g}; lower "
                         "--train-per-class (the slot takes 64 MiB with the project)")
    if out.exists():
        raise SystemExit(f"pack_eurosat_subset: {out} exists; remove it first (nothing was written)")
    for split, files in chosen.items():
        for path in files:
            target = out / split / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    summary = {"source": str(source), "rule": RULE.format(n=train_per_class), "train_per_class": train_per_class,
               "train_images": len(chosen["train"]), "valid_images": len(chosen["valid"]), "bytes": total}
    (out / "SUBSET.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from course_lib import paths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", help="EuroSAT folder with train/ and valid/ (default: ../shared/datasets/eurosat_rgb)")
    parser.add_argument("--out", default=str(paths.project_root() / "data_cache" / "eurosat_slot"))
    parser.add_argument("--train-per-class", type=int, default=1000)
    parser.add_argument("--max-mib", type=float, default=52.0)
    args = parser.parse_args(argv)
    source = Path(args.source) if args.source else paths.eurosat_shared_dir()
    if source is None:
        raise SystemExit("pack_eurosat_subset: no ../shared/datasets/eurosat_rgb beside the project; give --source")
    summary = pack(source, Path(args.out), args.train_per_class, args.max_mib)
    print(f"pack_eurosat_subset: {summary['train_images']} train + {summary['valid_images']} valid images, "
          f"{summary['bytes'] / 2**20:.1f} MiB in {args.out} ({summary['rule']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
