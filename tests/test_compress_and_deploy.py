"""Notebook 13's chapter: a teacher checkpoint is reused only when its config matches; claims and ISA tables."""
from conftest import tiny_config

from course_lib.chapters import compress_and_deploy as study
from course_lib.config import SAMPLE_DATA_DIR
from course_lib.measure.inventory import cpu_isa


def test_cached_fit_reuses_a_matching_checkpoint_only(tmp_path):
    config = tiny_config(tmp_path, data_dir=SAMPLE_DATA_DIR, max_steps=2)
    _, _, first = study.cached_fit(config, progress=False, verbose=False)
    _, history, second = study.cached_fit(config, progress=False, verbose=False)
    assert first == "trained" and second.startswith("reused") and history
    _, _, third = study.cached_fit(config.replace(lr=0.01), progress=False, verbose=False)
    assert third == "trained"
    # The first config's checkpoint survives the second's training: each has its own folder.
    _, _, fourth = study.cached_fit(config, progress=False, verbose=False)
    assert fourth == second


def test_cpu_isa_reads_the_flags():
    flags = cpu_isa("processor: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert flags["avx512_vnni"] and flags["avx2"] and not flags["amx_int8"]
    assert not any(cpu_isa("").values())


def test_claims_table_has_a_row_per_technique():
    table = study.claims_table({"pruning": "measured"})
    assert list(table.index) == list(study.ARTICLE)
    assert table.loc["pruning", "we measured"] == "measured" and table.loc["export", "we measured"] == "not run"
