"""Regenerate course_lib/data/splits/eurosat_rgb.json from the EuroSAT RGB folder beside the project
(../shared/datasets/eurosat_rgb, or the folder given as the one argument):

    python scripts/make_eurosat_split.py [FOLDER]
"""
import sys

from course_lib.data.fixed_splits import load_eurosat_split, write_eurosat_split
from course_lib.paths import eurosat_shared_dir

folder = sys.argv[1] if len(sys.argv) > 1 else eurosat_shared_dir()
if folder is None:
    sys.exit("make_eurosat_split: no ../shared/datasets/eurosat_rgb beside the project; "
             "give its folder as the argument")
path = write_eurosat_split(folder)
counts = {}
for split in load_eurosat_split(path).values():
    counts[split] = counts.get(split, 0) + 1
print(f"wrote {path}: {counts}")
