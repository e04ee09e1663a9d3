"""Committed results name a dataset by its name or a path relative to the project, never a folder of the
machine that made them; the benchmarks write them that way (`benchmarks/_shared.portable`)."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A path of the machine: a quoted or spaced string that starts at the file-system root with a usual top folder.
MACHINE_PATH = re.compile(r"""(?<![\w.~:/])/(?:work|home|root|tmp|Users|mnt|data|scratch|var)/[\w.-]""")
RESULTS = ("benchmarks/results", "results", "docs/results")


def _shared():
    spec = importlib.util.spec_from_file_location("bench_shared", ROOT / "benchmarks" / "_shared.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_committed_result_names_a_folder_of_the_machine_that_made_it():
    found = []
    for folder in RESULTS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".json", ".md", ".csv") and path.is_file():
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if MACHINE_PATH.search(line):
                        found.append(f"{path.relative_to(ROOT)}:{number}: {MACHINE_PATH.search(line).group(0)}")
    assert not found, "absolute paths in committed results:\n" + "\n".join(found[:20])


def test_the_pattern_finds_a_machine_path_and_spares_relative_ones():
    assert MACHINE_PATH.search('"data_dir": "/work/shared/datasets/eurosat_rgb"')
    assert MACHINE_PATH.search("reused /home/me/runs/last.pt")
    assert not MACHINE_PATH.search('"data_dir": "../shared/datasets/eurosat_rgb"')
    assert not MACHINE_PATH.search("https://example.org/data/eurosat.zip and runs/x/data/y")


def test_benchmarks_write_paths_relative_to_the_project(tmp_path):
    shared = _shared()
    root = str(shared.ROOT)
    text = (f'{{"data_dir": "{shared.ROOT.parent}/shared/datasets/eurosat_rgb", '
            f'"cache": "{root}/data_cache/x", "root": "{root}"}}')
    assert shared.portable(text) == ('{"data_dir": "../shared/datasets/eurosat_rgb", "cache": "data_cache/x", '
                                     '"root": "."}')
    shared.write(tmp_path / "r.json", text)
    assert root not in (tmp_path / "r.json").read_text()
