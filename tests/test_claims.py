"""The articles' claims: the registry, verdicts from intervals, the ledger round trip and the scoreboard."""
import json

import pytest
from conftest import ROOT

from course_lib import cli, ledger, report
from course_lib.analysis import claims


def test_the_registry_holds_the_articles_twenty_numeric_claims():
    assert len(claims.ARTICLE_CLAIMS) == 20
    notebooks = {path.name[:2] for path in (ROOT / "notebooks").glob("*.ipynb")}
    for key, claim in claims.ARTICLE_CLAIMS.items():
        assert claim.key == key and claim.article in claims.ARTICLES
        assert claim.notebook in notebooks, f"{key}: no notebook {claim.notebook}"
        assert claim.low is not None or claim.high is not None, f"{key} is numeric"
        assert claim.low is None or claim.high is None or claim.low <= claim.high
    assert not set(claims.QUALITATIVE_CLAIMS) & set(claims.ARTICLE_CLAIMS)


@pytest.mark.parametrize("value, interval, verdict", [
    (2.0, (1.8, 2.2), claims.HOLDS),            # inside 1.5-2.5x
    (1.4, (1.2, 1.55), claims.HOLDS),           # the interval meets the range: cannot be told apart
    (1.2, (1.1, 1.3), claims.DOES_NOT_HOLD),    # wholly below
    (3.0, None, claims.DOES_NOT_HOLD),          # a point above
    (1.6, None, claims.HOLDS),
])
def test_range_claims_hold_when_the_interval_meets_the_range(value, interval, verdict):
    assert claims.measured("opencv_decode", value, interval, hardware="h").verdict == verdict


@pytest.mark.parametrize("interval, verdict", [((0.2, 1.5), claims.HOLDS), ((-0.3, 1.5), claims.DOES_NOT_HOLD),
                                               ((-2.0, -0.5), claims.DOES_NOT_HOLD)])
def test_beats_claims_need_the_whole_interval_beyond_noise(interval, verdict):
    claim = claims.measured("adamw_vs_sgd", sum(interval) / 2, interval, hardware="h")
    assert claim.verdict == verdict


def test_one_sided_claims_and_formatting():
    holds = claims.measured("ddp_efficiency", 90.0, (86.0, 93.0), hardware="h")
    assert holds.verdict == claims.HOLDS and holds.claimed == ">= 85%"
    row = claims.measured("amp_speedup", 1.83, (1.7, 1.9), "bf16 vs fp32", hardware="h").row()
    assert row["measured"] == "1.83x" and row["interval"] == "[1.70x, 1.90x]" and row["claimed"] == "1.50x to 3.00x"


def test_bad_inputs_are_named():
    with pytest.raises(KeyError, match="unknown claim 'amp'.*amp_speedup"):
        claims.measured("amp", 1.0)
    with pytest.raises(ValueError, match="finite number"):
        claims.measured("amp_speedup", float("nan"), hardware="h")
    with pytest.raises(ValueError, match="must contain the value"):
        claims.measured("amp_speedup", 2.0, (2.1, 2.5), hardware="h")
    with pytest.raises(ValueError, match="say why"):
        claims.not_measurable("pin_memory", "")


def test_show_records_every_claim_and_the_scoreboard_reads_the_newest_per_machine(capsys):
    claims.show([claims.measured("opencv_decode", 1.2, (1.1, 1.3), "old run", hardware="machine A")])
    table = claims.show([claims.measured("opencv_decode", 2.0, (1.9, 2.1), "64 px", hardware="machine A"),
                         claims.measured("opencv_decode", 1.1, (1.0, 1.2), "64 px", hardware="machine B"),
                         claims.not_measurable("pin_memory", "no CUDA device", hardware="machine A")])
    assert "measured on: machine A; machine B" in capsys.readouterr().out
    assert list(table.verdict) == [claims.HOLDS, claims.DOES_NOT_HOLD, claims.NOT_MEASURABLE]
    assert len(ledger.Ledger().rows(kind=claims.LEDGER_KIND)) == 4
    board = claims.scoreboard()
    decode = [item for item in board if item["key"] == "opencv_decode"]
    assert sorted((item["hardware"], item["measured"]) for item in decode) == [("machine A", "2.00x"),
                                                                                ("machine B", "1.10x")]
    assert next(item for item in board if item["key"] == "pin_memory")["verdict"] == claims.NOT_MEASURABLE
    unmeasured = [item for item in board if item["verdict"] == claims.NOT_MEASURED]
    assert len(unmeasured) == 18 and {item["key"] for item in unmeasured} == set(claims.ARTICLE_CLAIMS) - {
        "opencv_decode", "pin_memory"}


def test_workbook_claims_prints_text_and_json(capsys):
    claims.record([claims.measured("tar_shards", 6.0, (5.5, 6.5), "warm cache", hardware="machine A")])
    assert cli.main(["claims"]) == 0
    text = capsys.readouterr().out
    assert "[02] tar_shards (A1 §3.4): holds" in text and "1 holds, 0 does not hold" in text
    assert cli.main(["claims", "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert len(board) == 20 and {item["verdict"] for item in board} == {claims.HOLDS, claims.NOT_MEASURED}


def test_the_run_report_has_the_scoreboard():
    claims.record([claims.measured("amp_speedup", 1.1, (1.0, 1.2), hardware="machine A")])
    page = report.scoreboard_html()
    assert "Claims scoreboard" in page and "does not hold" in page and page.count("<tr>") == 21


def test_an_interval_that_contains_no_effect_has_not_shown_the_claim():
    wide = claims.measured("regularization_remote_sensing", 0.5, (-9.0, 9.0), "3 seeds", hardware="h")
    assert wide.verdict == claims.DOES_NOT_HOLD
    assert "contains 0.00 points (no effect): not shown beyond noise" in wide.reason
    speed = claims.measured("amp_speedup", 1.3, (0.9, 1.6), hardware="h")
    assert speed.verdict == claims.DOES_NOT_HOLD and "contains 1.00x (no effect)" in speed.reason
    level = claims.measured("resnet50_amp_memory", 14.0, (11.0, 17.0), hardware="h")  # a level, not an effect
    assert level.verdict == claims.HOLDS and "no effect" not in level.reason
