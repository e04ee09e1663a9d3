"""Convergence floors: a chapter's model is checked against its floor on EuroSAT in the cpu, reference and gpu profiles."""
import pytest

from course_lib.analysis import floors


def test_a_model_meets_or_misses_its_floor_on_eurosat():
    met = floors.check("09", "the analysed model", 0.971, "eurosat", "cpu")
    assert met.applies and met.met and "met, top-1 97.1% >= 95%" in met.line
    missed = floors.check("09", "the analysed model", 0.461, "eurosat", "cpu")
    assert missed.applies and missed.met is False and "MISSED" in missed.line and "train longer" in missed.line


def test_the_reference_profile_checks_its_floors_too():
    """The long runs are the ones whose verdicts are committed: a floor missed there must say so."""
    assert floors.check("13", "the distilled student", 0.95, "eurosat", "reference").met
    missed = floors.check("13", "the distilled student", 0.43, "eurosat", "reference")
    assert missed.applies and missed.met is False


@pytest.mark.parametrize("data, profile", [("landcover-synth", "cpu"), ("eurosat", "smoke")])
def test_the_floor_is_not_checked_off_eurosat_or_in_the_smoke_profile(data, profile):
    found = floors.check("13", "the teacher", 0.3, data, profile)
    assert not found.applies and found.met is None and "not checked here" in found.line


def test_a_relative_floor_counts_from_the_model_it_comes_from():
    assert floors.check("13", "the pruned model", 0.955, "eurosat", "cpu", against=0.97).met
    assert not floors.check("13", "the pruned model", 0.449, "eurosat", "cpu", against=0.979).met
    with pytest.raises(ValueError, match="pass `against`"):
        floors.check("13", "the pruned model", 0.95, "eurosat", "cpu")
    with pytest.raises(KeyError, match="no floor for notebook 09's 'the teacher'"):
        floors.check("09", "the teacher", 0.95, "eurosat", "cpu")
