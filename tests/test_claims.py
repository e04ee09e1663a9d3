"""The articles' claims: the registry, verdicts from intervals, the ledger round trip and the scoreboard."""
import dataclasses
import json

import pytest
from conftest import ROOT

from course_lib import cli, ledger, paths, report
from course_lib.analysis import claims
from course_lib.chapters import regularization_study, weight_choice


def test_the_registry_holds_the_articles_twenty_two_numeric_claims():
    assert len(claims.ARTICLE_CLAIMS) == 22
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
    (1.2, (1.1, 1.3), claims.REFUTED),          # wholly below
    (3.0, None, claims.REFUTED),                # a point above
    (1.2, (0.9, 1.3), claims.REFUTED),          # wholly below, though it contains 1x: the range is excluded
    (1.3, (0.9, 1.6), claims.NOT_SHOWN),        # meets the range and contains 1x: inconclusive
    (1.6, None, claims.HOLDS),
])
def test_range_claims_hold_when_the_interval_meets_the_range(value, interval, verdict):
    assert claims.measured("opencv_decode", value, interval, hardware="h").verdict == verdict


@pytest.mark.parametrize("interval, verdict", [((0.2, 1.5), claims.HOLDS), ((-0.3, 1.5), claims.NOT_SHOWN),
                                               ((-2.0, -0.5), claims.REFUTED)])
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
    assert list(table.verdict) == [claims.HOLDS, claims.REFUTED, claims.NOT_MEASURABLE]
    assert len(ledger.Ledger().rows(kind=claims.LEDGER_KIND)) == 4
    board = claims.scoreboard()
    decode = [item for item in board if item["key"] == "opencv_decode"]
    assert sorted((item["hardware"], item["measured"]) for item in decode) == [("machine A", "2.00x"),
                                                                                ("machine B", "1.10x")]
    assert next(item for item in board if item["key"] == "pin_memory")["verdict"] == claims.NOT_MEASURABLE
    unmeasured = [item for item in board if item["verdict"] == claims.NOT_MEASURED]
    assert len(unmeasured) == 20 and {item["key"] for item in unmeasured} == set(claims.ARTICLE_CLAIMS) - {
        "opencv_decode", "pin_memory"}


def test_workbook_claims_prints_text_and_json(capsys):
    claims.record([claims.measured("tar_shards", 6.0, (5.5, 6.5), "warm cache", hardware="machine A")])
    assert cli.main(["claims"]) == 0
    text = capsys.readouterr().out
    assert "[02] tar_shards (A1 §3.4): holds" in text and ("1 holds, 0 refuted, 0 not shown beyond noise, 0 not measurable here, 21 not measured yet; apart from "
                                                                  "these, 0 demonstrated (shown, not measured)") in text
    assert cli.main(["claims", "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert len(board) == 22 and {item["verdict"] for item in board} == {claims.HOLDS, claims.NOT_MEASURED}


def test_the_run_report_has_the_scoreboard():
    claims.record([claims.measured("amp_speedup", 1.1, (1.0, 1.2), hardware="machine A")])
    page = report.scoreboard_html()
    assert "Claims scoreboard" in page and claims.NOT_SHOWN in page and page.count("<tr>") == 23
    assert "does not hold" not in page and "smoke" not in page


def test_an_interval_that_contains_no_effect_has_not_shown_the_claim():
    wide = claims.measured("regularization_remote_sensing", 0.5, (-9.0, 9.0), "3 seeds", hardware="h")
    assert wide.verdict == claims.NOT_SHOWN
    assert "contains 0.00 points (no effect): not shown beyond noise" in wide.reason
    speed = claims.measured("amp_speedup", 1.3, (0.9, 1.6), hardware="h")
    assert speed.verdict == claims.NOT_SHOWN and "contains 1.00x (no effect)" in speed.reason
    refuted = claims.measured("amp_speedup", 1.1, (0.9, 1.3), hardware="h")  # below 1.5x, whatever the noise
    assert refuted.verdict == claims.REFUTED and "not shown beyond noise" not in refuted.reason
    level = claims.measured("resnet50_amp_memory", 14.0, (11.0, 17.0), hardware="h")  # a level, not an effect
    assert level.verdict == claims.HOLDS and "no effect" not in level.reason


def test_every_verdict_is_one_of_four_and_checks_read_holds_refuted_or_not_shown():
    assert claims.VERDICTS == ("holds", "refuted", "not shown beyond noise", "not measurable here",
                               "demonstrated (shown, not measured)")
    assert [claims.checked("channels_last", holds, "a check", hardware="h").verdict for holds in (True, False, None)] \
        == [claims.HOLDS, claims.REFUTED, claims.NOT_SHOWN]
    assert [claims.beyond_noise(*interval, 1.0) for interval in ((1.1, 1.3), (0.7, 0.9), (0.9, 1.2))] == [
        True, False, None]


def test_smoke_profile_verdicts_are_kept_apart_and_not_counted(capsys, monkeypatch):
    from course_lib import ledger as ledger_module

    claims.show([claims.measured("tar_shards", 6.0, (5.5, 6.5), "cpu run", hardware="machine A")], profile="cpu")
    monkeypatch.setenv(ledger_module.PROFILE_ENV, "smoke")  # what the runner exports for a smoke run
    claims.record([claims.measured("tar_shards", 0.8, (0.7, 0.9), "4 steps", hardware="machine A"),
                   claims.measured("amp_speedup", 0.3, (0.2, 0.4), "4 steps", hardware="machine A")])
    monkeypatch.delenv(ledger_module.PROFILE_ENV)
    assert [row["profile"] for row in ledger.Ledger().rows(kind=claims.LEDGER_KIND)] == ["smoke", "smoke", "cpu"]
    board = claims.scoreboard()
    shards = [item for item in board if item["key"] == "tar_shards"]
    # The newer smoke run does not hide the cpu run: each has its own newest per machine.
    assert [(item["verdict"], item["profile"], item["evidence"]) for item in shards] == [
        (claims.HOLDS, "cpu", True), (claims.SMOKE, "smoke", False)]
    assert shards[1]["verdict_as_measured"] == claims.REFUTED
    amp = [item for item in board if item["key"] == "amp_speedup"]
    assert [item["verdict"] for item in amp] == [claims.NOT_MEASURED, claims.SMOKE]
    assert claims.verdict_counts(board) == {claims.HOLDS: 1, claims.REFUTED: 0, claims.NOT_SHOWN: 0,
                                            claims.NOT_MEASURABLE: 0, claims.DEMONSTRATED: 0, claims.NOT_MEASURED: 21}
    assert cli.main(["claims"]) == 0
    text = capsys.readouterr().out
    assert "1 holds, 0 refuted" in text and "profile cpu" in text
    assert "smoke: not evidence (2 measurement(s) of the smoke profile, left out of the counts)" in text
    assert "[03] amp_speedup: measured 0.30x [0.20x, 0.40x] on" in text
    smoke_lines = text.split("left out of the counts):")[1]
    assert "refuted" not in smoke_lines and "holds" not in smoke_lines  # issue 50: no smoke verdict, even as measured
    assert cli.main(["claims", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sum(item["verdict"] == claims.SMOKE for item in listed) == 2
    page = report.scoreboard_html()
    assert "smoke: not evidence: 2 measurement(s)" in page and "as measured" not in page
    smoke_table = page.split("<details>")[1]
    assert ">refuted</td>" not in smoke_table and ">holds</td>" not in smoke_table  # no verdict cell in it
    assert page.split("<details>")[0].count("smoke: not evidence") == 0  # the main table has no smoke row


def test_rows_without_a_profile_read_unknown_and_old_verdicts_are_reworded():
    book = ledger.Ledger()
    old = claims.measured("amp_speedup", 1.3, (0.9, 1.6), hardware="machine A")
    fields = {k: v for k, v in dataclasses.asdict(old).items() if k not in ("key", "hardware")}
    book.record(claims.LEDGER_KIND, "amp_speedup", parameters={"hardware_line": "machine A"},
                metrics={**fields, "verdict": claims.LEGACY_DOES_NOT_HOLD})
    failed_check = claims.checked("amp_accuracy", False, "top-1 fell", hardware="machine A")
    book.record(claims.LEDGER_KIND, "amp_accuracy", parameters={"hardware_line": "machine A"},
                metrics={**{k: v for k, v in dataclasses.asdict(failed_check).items() if k not in ("key", "hardware")},
                         "verdict": claims.LEGACY_DOES_NOT_HOLD})
    board = {item["key"]: item for item in claims.scoreboard(book) if item["hardware"] == "machine A"}
    assert board["amp_speedup"]["profile"] == claims.UNKNOWN_PROFILE and board["amp_speedup"]["evidence"]
    assert board["amp_speedup"]["verdict"] == claims.NOT_SHOWN
    assert board["amp_accuracy"]["verdict"] == claims.REFUTED



def test_every_accuracy_claim_is_registered_under_its_own_notebook():
    for notebook, keys in claims.ACCURACY_CLAIMS.items():
        assert keys and len(set(keys)) == len(keys)
        assert {claims.article_claim(key).notebook for key in keys} == {notebook}


def test_accuracy_verdicts_are_counted_per_notebook_newest_first_smoke_left_out(capsys, monkeypatch, tmp_path):
    from course_lib import ledger as ledger_module
    from course_lib.analysis import reference

    monkeypatch.setattr(reference, "folder", lambda: tmp_path / "no-reference")  # the reader's counts alone

    claims.record([claims.measured("adamw_vs_sgd", 1.0, (-2.0, 4.0), "an old run", hardware="machine A"),
                   claims.checked("ema_steady_gain", None, "contains 0", hardware="machine A")], profile="cpu")
    claims.record([claims.measured("adamw_vs_sgd", 7.0, (1.7, 12.3), "AdamW - SGD", hardware="machine B"),
                   claims.checked("too_many_tricks", False, "refuted", hardware="machine A"),
                   claims.not_measurable("regularization_cifar10", "no CIFAR-10 here", hardware="machine A")],
                  profile="cpu")
    monkeypatch.setenv(ledger_module.PROFILE_ENV, "smoke")  # a smoke run's verdicts are not evidence
    claims.record([claims.checked("adamw_sensitivity", True, "4 steps", hardware="machine A")])
    monkeypatch.delenv(ledger_module.PROFILE_ENV)
    counts = claims.accuracy_counts(claims.scoreboard())
    assert list(counts) == ["03", "05", "06", "07", "08", "09", "10", "12", "13", "15"]
    # 06: the newer machine B run (holds) counts, not machine A's older inconclusive one; the smoke
    # check of adamw_sensitivity is left out, so that claim is not measured yet (nor are the batch and
    # schedule claims).
    assert counts["06"] == {claims.CONCLUSIVE: 1, claims.INCONCLUSIVE: 0, claims.NOT_MEASURABLE: 0,
                            claims.NOT_MEASURED: 3, "total": 4}
    assert counts["07"] == {claims.CONCLUSIVE: 1, claims.INCONCLUSIVE: 1, claims.NOT_MEASURABLE: 1,
                            claims.NOT_MEASURED: 8, "total": 11}
    assert counts["13"][claims.NOT_MEASURED] == counts["13"]["total"] == 3
    text = claims.format_accuracy_counts(counts)
    assert text.splitlines()[2] == "06: 1 of 4 accuracy verdicts conclusive (3 not measured yet)"
    assert ("07: 1 of 11 accuracy verdicts conclusive (1 inconclusive, 1 not measurable here, 8 not measured yet)"
            in text)
    assert cli.main(["claims"]) == 0
    shown = capsys.readouterr().out
    assert "accuracy verdicts per notebook (yours):\n    03: 0 of 1" in shown
    assert "\n    06: 1 of 4 accuracy verdicts conclusive" in shown
    assert "(reference" not in shown  # no reference result in this test's folder
    assert "Conclusive accuracy verdicts per notebook (yours): 03: 0 of 1; 05: 0 of 1; 06: 1 of 4; 07: 1 of 11;" in \
        report.scoreboard_html()
    with pytest.raises(ValueError, match="count 'yours'"):
        claims.accuracy_counts([], whose="mine")


def test_the_references_accuracy_verdicts_are_counted_apart_from_the_readers(tmp_path, capsys, monkeypatch):
    from course_lib.analysis import reference

    claim_rows = [dataclasses.asdict(claims.measured("adamw_vs_sgd", 7.0, (1.7, 12.3), "AdamW - SGD, 3 seeds",
                                                     hardware="machine R")),
                  dataclasses.asdict(claims.checked("adamw_sensitivity", None, "within noise", hardware="machine R"))]
    reference.save(reference.Reference(notebook="06", hardware="machine R", date="2026-12-02", profile="cpu",
                                       command="workbook run --profile cpu --only 06", parameters={}, versions={},
                                       run_id="r", claims=claim_rows), tmp_path)
    board = [{"key": "adamw_vs_sgd", "verdict": claims.REFUTED, "evidence": True, "created_at": "2026"}]
    yours = claims.accuracy_counts(board)
    theirs = claims.accuracy_counts(board, whose="reference", root=tmp_path)
    assert (yours["06"][claims.CONCLUSIVE], yours["06"][claims.NOT_MEASURED]) == (1, 3)
    assert (theirs["06"][claims.CONCLUSIVE], theirs["06"][claims.INCONCLUSIVE]) == (1, 1)
    assert theirs["07"][claims.NOT_MEASURED] == theirs["07"]["total"] == 11
    assert claims.accuracy_counts_table(theirs).splitlines()[4] == "| 06 | 1 | 1 | 0 | 2 | 4 |"
    table = claims.accuracy_results_table(tmp_path).splitlines()
    assert table[2].startswith("| 03 | `amp_accuracy` | - | - | not in the reference | no reference")
    assert table[3].startswith("| 05 | `syncbn_small_batches` | - | - | not in the reference | no reference")
    assert table[4].startswith("| 06 | `adamw_vs_sgd` | +7.00 points | [+1.70 points, +12.30 points] | holds | AdamW")
    assert table[6].startswith("| 06 | `batch_lr_scaling` | - | - | not in the reference | -")
    assert table[8].startswith("| 07 | `regularization_remote_sensing` | - | - | not in the reference | no reference")
    monkeypatch.setattr(reference, "folder", lambda: tmp_path)
    assert cli.main(["reference", "table"]) == 0
    shown = capsys.readouterr().out
    assert "| 06 | 1 | 1 | 0 | 2 | 4 |" in shown and "| 06 | `adamw_vs_sgd` |" in shown


def test_the_results_pages_accuracy_tables_are_those_of_the_committed_reference_results():
    from course_lib.analysis import reference

    if not list(reference.folder().glob("*/*.json")):
        pytest.skip("no reference result is committed (results/reference/)")
    page = (ROOT / "docs" / "results.md").read_text()
    for table in (claims.accuracy_counts_table(claims.accuracy_counts(whose="reference")),
                  claims.accuracy_results_table()):
        assert table in page, "a table of the reference results in docs/results.md is stale: run `workbook docs tables`"


# --- issue 51, point 0: no verdict holds on "no effect" or on the opposite effect ------------------------------

def _null_intervals(rule: claims.Rule) -> list[tuple[float, float]]:
    """The intervals on which a claim decided by `rule` must not hold: "no effect" (a point, a narrow and a wide
    interval around 0) for a claim of an effect, and for every kind the opposite effect beyond its margin (for a
    "not worse" or "at most" claim, no effect is the claim itself: only the opposite must fail)."""
    margin = rule.margin
    no_effect = [(0.0, 0.0), (-0.1 * margin, 0.1 * margin), (-3 * margin, 3 * margin)]
    opposite = {claims.GAIN: [(-2 * margin, -margin), (-10 * margin, -0.5 * margin)],
                claims.LOSS: [(margin, 2 * margin), (0.5 * margin, 10 * margin)],
                claims.CHANGE: [],  # either direction is the claim; its opposite is no change
                claims.NON_INFERIOR: [(-3 * margin, -1.5 * margin)],
                claims.AT_MOST: [(1.5 * margin, 3 * margin)]}[rule.kind]
    return (no_effect if rule.kind in (claims.GAIN, claims.LOSS, claims.CHANGE) else []) + opposite


def holds_on_null(decider, rule: claims.Rule) -> list[tuple[float, float]]:
    """The null intervals (`_null_intervals`) on which `decider(rule, low, high)` says HOLDS."""
    return [interval for interval in _null_intervals(rule) if decider(rule, *interval) == claims.HOLDS]


@pytest.mark.parametrize("key", list(claims.RULES))
def test_no_rule_holds_on_no_effect_or_on_the_opposite_effect(key):
    assert holds_on_null(claims.decide, claims.RULES[key]) == []
    assert claims.RULES[key].why and claims.RULES[key].margin > 0  # a margin, stated with its reason


def test_the_null_check_fails_a_planted_claim_that_holds_on_everything():
    def planted(rule, low, high):
        return claims.HOLDS

    assert all(holds_on_null(planted, rule) for rule in claims.RULES.values())


@pytest.mark.parametrize("key", [key for key, claim in claims.ARTICLE_CLAIMS.items() if claim.no_effect is not None])
def test_no_numeric_claim_of_an_effect_holds_on_no_effect_or_the_opposite(key):
    claim = claims.ARTICLE_CLAIMS[key]
    none = claim.no_effect
    step = abs(claim.low if claim.low not in (None, none) else claim.high or 1.0) or 1.0
    away = (none - 2 * step, none - step) if claim.low is not None and claim.low >= none else (none + step, none + 2 * step)
    for low, high in ((none, none), (none - 0.1 * step, none + 0.1 * step), (none - 3 * step, none + 3 * step), away):
        assert claims.judge(claim, (low + high) / 2, low, high) != claims.HOLDS, (low, high)


def test_a_rule_decides_gain_loss_change_non_inferiority_and_at_most():
    gain, loss, change, not_worse, at_most = (claims.Rule(kind, 0.5, "points", "a test") for kind in claims.RULE_KINDS)
    assert [claims.decide(gain, *i) for i in ((0.2, 1.0), (-0.2, 1.0), (-0.3, 0.4), (0.1, 0.4))] == [
        claims.HOLDS, claims.NOT_SHOWN, claims.REFUTED, claims.REFUTED]  # the last: real, but below worth having
    assert [claims.decide(loss, *i) for i in ((-1.0, -0.2), (-0.4, 0.3))] == [claims.HOLDS, claims.REFUTED]
    assert [claims.decide(change, *i) for i in ((-1.0, -0.2), (0.6, 0.9), (-0.4, 0.3), (-0.4, 0.9))] == [
        claims.HOLDS, claims.HOLDS, claims.REFUTED, claims.NOT_SHOWN]
    assert [claims.decide(not_worse, *i) for i in ((-0.4, 2.0), (-0.6, 2.0), (-2.0, -0.6))] == [
        claims.HOLDS, claims.NOT_SHOWN, claims.REFUTED]
    assert [claims.decide(at_most, *i) for i in ((-2.0, 0.4), (0.0, 0.6), (0.6, 2.0))] == [
        claims.HOLDS, claims.NOT_SHOWN, claims.REFUTED]
    assert claims.combine(claims.HOLDS, claims.HOLDS) == claims.HOLDS
    assert claims.combine(claims.HOLDS, claims.REFUTED) == claims.REFUTED
    assert claims.combine(claims.HOLDS, claims.NOT_SHOWN) == claims.NOT_SHOWN
    with pytest.raises(ValueError, match="rule kind 'maybe'"):
        claims.decide(claims.Rule("maybe", 0.5, "points", "a test"), 0.0, 1.0)


def test_decided_names_its_rule_and_a_demonstration_is_counted_apart(monkeypatch):
    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    found = claims.decided("label_smoothing_alone", 0.1, (-0.1, 0.3), "paired over 5 seeds")
    assert found.verdict == claims.REFUTED and found.unit == "points"
    assert "rule: holds above 0 reaching +0.5 points" in found.reason and "two seeds' spread" in found.reason
    with pytest.raises(KeyError, match="has no rule"):
        claims.decided("tar_shards", 1.0, None, "a test")
    shown = claims.demonstrated("warmup_cosine", True, "the scheduler against its formula")
    assert shown.verdict == claims.DEMONSTRATED
    assert claims.demonstrated("warmup_cosine", False, "a broken scheduler").verdict == claims.REFUTED
    board = [{"verdict": shown.verdict, "evidence": True}, {"verdict": claims.HOLDS, "evidence": True}]
    assert claims.format_counts(board).startswith("1 holds, 0 refuted") and \
        claims.format_counts(board).endswith("apart from these, 1 demonstrated (shown, not measured)")


# Every accuracy chapter's claim function on made-up "no effect" and "opposite effect" results (the builders of
# its own tests): a claim of an effect must not hold on either, a "not worse" or "at most" claim not on the
# opposite. `keys`: the claims the case must not hold (the others are checks the case does not feed).

def _chapter_07(effect, monkeypatch):
    from test_regularization_study import _fake_study

    from course_lib.measure import peak

    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: 1e12)
    base = [0.80, 0.82, 0.84]
    shift = {"none": 0.0, "opposite": -0.01}[effect]
    tricks = {name: [value + shift for value in base] for name in ("label_smoothing", "mixup", "ema", "article_combo")}
    everything = [value + (0.01 if effect == "opposite" else 0.0) for value in tricks["article_combo"]]
    study = _fake_study({"baseline": base, **tricks, "everything": everything},
                        ema_gain=[shift] * 3, speeds={"article_combo": [50.0] * 3} if effect == "opposite" else None)
    control = _fake_study({"baseline": base, "mixup": base, "article_combo": base}, data="CIFAR-10")
    keys = ["regularization_remote_sensing", "regularization_cifar10", "mixup_remote_sensing", "ema_steady_gain",
            "too_many_tricks", "label_smoothing_alone", "label_smoothing_calibration"]
    return regularization_study.claims(study, control, True), keys + (
        ["combo_training_time"] if effect == "opposite" else [])


def _chapter_07_weights(effect, monkeypatch):
    from test_weight_choice import weight_runs

    gain = {"none": 0.0, "opposite": -3.0}[effect]
    choice = weight_runs({"EMA": gain, "SWA": gain, "best.pt": gain, "early": gain})
    return weight_choice.claims(choice), ["best_checkpoint_gain", "swa_gain"] + (
        ["early_stopping"] if effect == "opposite" else [])


def _chapter_13(effect, monkeypatch):
    from test_compress_and_deploy import _tables

    from course_lib.chapters import compress_and_deploy

    labels_only = (0.78, 0.79, 0.80)
    if effect == "none":  # a student exactly as good as labels alone: "not worse" is its claim, so no key
        return compress_and_deploy.claims(*_tables(distilled_top1=labels_only)), []
    return (compress_and_deploy.claims(*_tables(distilled_top1=tuple(v - 0.05 for v in labels_only),
                                                      channel_top1=0.45, rehearsal_forgetting=80.0)),
            ["deploy_distillation", "deploy_pruning", "continual_learning"])


def _chapter_15(effect, monkeypatch):
    from test_data_quality import _runs, _study

    from course_lib.chapters import data_quality

    gains = {"none": [0.0, 0.001, -0.001], "opposite": [-0.02, -0.021, -0.019]}[effect]
    return data_quality.claims(_study(), data_quality.recovery_table(_runs(gains))), ["cleaning_recovers_accuracy"]


def _chapter_09(effect, monkeypatch):
    from test_confusion_study import CLASSES, PAIRS, SUMMARY, imbalance, predictions_with_recall

    from course_lib.chapters import confusion_study

    delta = {"none": {"delta": 0.0, "low": -0.004, "high": 0.004},
             "opposite": {"delta": -0.03, "low": -0.045, "high": -0.015}}[effect]
    found = confusion_study.claims(SUMMARY, CLASSES, PAIRS, 0.6, 0.2, SUMMARY, {"top1": delta}, 0.2)
    plain = predictions_with_recall([0.9, 0.8, 0.6, 0.4])
    corrected = plain if effect == "none" else predictions_with_recall([0.9, 0.6, 0.3, 0.1])
    study = imbalance({"none": plain, "weighted_loss": corrected, "sampler": corrected})
    return found + confusion_study.imbalance_claims(study, draws=200), ["mixup_helps_09", "imbalance_weighted_loss",
                                                                      "imbalance_sampler"]


def _chapter_06(effect, monkeypatch):
    from test_optimizer_study import article_values, grid_frame, range_tests

    from course_lib.chapters import optimizer_study

    def accuracy(optimizer, lr, seed):
        worse = 0.05 if effect == "opposite" and optimizer == "adamw" else 0.0
        return 0.80 + 0.01 * seed - worse

    return optimizer_study.claims(grid_frame(accuracy), range_tests(), article_values()), ["adamw_vs_sgd"]


def _chapter_06_schedule(effect, monkeypatch):
    from test_scaling_study import schedule_frame

    from course_lib.chapters import scaling_study

    def accuracy(config):  # the optimizer moves top-1 when the effect is opposite, the schedule never does
        return 0.6 + 0.001 * config.seed + (0.05 if effect == "opposite" and config.optimizer == "adamw" else 0.0)

    return scaling_study.schedule_claims(scaling_study.schedule_vs_optimizer(schedule_frame(accuracy)), "test"), [
        "schedule_over_optimizer"]


def _chapter_03(effect, monkeypatch):
    from test_mixed_precision import accuracy_table, speed_table

    from course_lib.chapters import mixed_precision

    speeds = speed_table([100, 102, 98], [180, 185, 178], [170, 172, 169])
    reduced = {"none": [0.80, 0.82, 0.81], "opposite": [0.70, 0.71, 0.72]}[effect]
    found = mixed_precision.claims(speeds, "fp16", 0.5, accuracy_table([0.80, 0.82, 0.81], reduced, "fp16"),
                                   device="cuda:0")
    return found, ["amp_accuracy"] if effect == "opposite" else []


def _chapter_12(effect, monkeypatch):
    from test_model_family import _pairs, _run

    from course_lib.chapters import model_family

    gains = {"none": [0.0, 0.0, 0.0, 0.0], "opposite": [0.05, 0.051, 0.049, 0.05]}[effect]
    vit = [_run(name, seed, 0.8, val_loss=1.0 - (0.3 if effect == "opposite" and name != "resnet18" else 0.0))
           for seed in range(3) for name in ("resnet18", model_family.VITS[0])]
    found = model_family.claims(_pairs(gains) + vit, hardware="test machine")
    return found, ["vit_overfits_small_data"] + (["bigger_model_not_better"] if effect == "opposite" else [])


def _chapter_08(effect, monkeypatch):
    from test_transfer_plans import _grid

    from course_lib.chapters import transfer_plans

    scratch = (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.88, 0.88, 0.89, 0.9)
    worse = tuple(value - 0.05 for value in scratch)
    fine_tune = scratch if effect == "none" else worse
    frozen = fine_tune if effect == "none" else tuple(value - 0.05 for value in worse)
    results, verdict = _grid(fine_tune, frozen, scratch)
    found = transfer_plans.claims(results, verdict)
    return found, ["transfer_learning", "transfer_beats_scratch"] + (
        ["transfer_freeze_recipe"] if effect == "opposite" else [])


def _chapter_05(effect, monkeypatch):
    from course_lib.chapters import sync_bn_study

    shift = {"none": 0.0, "opposite": -0.03}[effect]
    rows = [{"per-process batch": batch, "sync_batchnorm": synced, "seed": seed, "global batch": 2 * batch,
             "val top-1": 0.7 + 0.01 * seed + (shift if synced else 0.0), "step ms": 10.0}
            for seed in range(3) for batch in (2, 32) for synced in (False, True)]
    real = paths.DataChoice({"dataset": "imagefolder", "data_dir": "eurosat"}, "eurosat", "a test", False)
    return [sync_bn_study.claim(rows, real, hardware="test machine")], ["syncbn_small_batches"]


def _chapter_07_augmentation(effect, monkeypatch):
    from test_augmentation_strength import strength_rows

    from course_lib.chapters import augmentation_strength

    # none: every level alike; opposite: augmentation widens the gap and costs validation top-1
    gap, val = {"none": (0.0, 0.0), "opposite": (-0.05, -0.04)}[effect]
    rows = strength_rows({"none": (0.0, 0.0), "light": (gap, val), "heavy": (gap, val)})
    return augmentation_strength.claims(rows, hardware="test machine"), ["augmentation_prevents_overfitting"]


CHAPTER_CASES = {"03": _chapter_03, "05": _chapter_05, "06": _chapter_06, "06 schedule": _chapter_06_schedule,
                 "07": _chapter_07, "07 weights": _chapter_07_weights, "07 augmentation": _chapter_07_augmentation,
                 "08": _chapter_08, "09": _chapter_09, "12": _chapter_12, "13": _chapter_13, "15": _chapter_15}


@pytest.mark.parametrize("effect", ["none", "opposite"])
@pytest.mark.parametrize("chapter", list(CHAPTER_CASES))
def test_no_chapter_claim_holds_on_no_effect_or_the_opposite(chapter, effect, monkeypatch):
    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    found, keys = CHAPTER_CASES[chapter](effect, monkeypatch)
    verdicts = {claim.key: claim.verdict for claim in found}
    assert set(keys) <= set(verdicts), f"{chapter} did not return {set(keys) - set(verdicts)}"
    holding = {key: verdicts[key] for key in keys if verdicts[key] == claims.HOLDS}
    assert not holding, f"{chapter}: these claims hold on {effect} effect: {holding}"


@pytest.mark.parametrize("profile", ["smoke", "rehearsal"])
def test_a_smoke_runs_claims_table_shows_no_verdict(profile, capsys):
    """Issue 50: chapter 12 marked the EuroSAT 97.23% claim "refuted" after 3 seconds on synthetic images."""
    shown = claims.show([claims.measured("tar_shards", 0.8, (0.7, 0.9), "4 steps", hardware="machine A")],
                        profile=profile)
    assert list(shown["verdict"]) == ["smoke run: not evidence"]
    assert "not evidence for or against any claim" in capsys.readouterr().out
    board = [item for item in claims.scoreboard() if item["key"] == "tar_shards"]
    assert [(item["verdict"], item["evidence"]) for item in board] == [(claims.NOT_MEASURED, True),
                                                                       (claims.SMOKE, False)]  # not counted


def test_a_cpu_runs_claims_table_keeps_its_verdicts(capsys):
    shown = claims.show([claims.measured("tar_shards", 6.0, (5.5, 6.5), "cpu run", hardware="machine A")],
                        profile="cpu")
    assert list(shown["verdict"]) == [claims.HOLDS] and "not evidence" not in capsys.readouterr().out


def test_a_ledger_path_with_no_ledger_is_one_line_and_creates_nothing(tmp_path, capsys):
    """`workbook claims --path <typo>/x.sqlite` once created the folder and an empty ledger (issue 49)."""
    from course_lib import cli

    typo = tmp_path / "rnus" / "ledger.sqlite"
    assert cli.main(["claims", "--path", str(typo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--path {typo}: no ledger file there" in err[0]
    assert not typo.parent.exists()


def test_one_foreign_claim_row_or_reference_file_is_left_out_in_one_line(tmp_path, monkeypatch, capsys):
    """Issue 49 point 5: one claim row with a missing field, or one reference file with a wrong type, made every
    `workbook run`, `claims`, `report` and `docs build` crash. Each is one warning line and left out."""
    from course_lib.analysis import reference

    claims.record([claims.measured("amp_speedup", 1.8, (1.6, 2.0), "bf16 against fp32", hardware="machine A")],
                  profile="cpu")
    book = ledger.Ledger()
    missing = book.record("claim", "channels_last_speedup", metrics={"measured": 1.2})  # no verdict, no unit ...
    wrong = book.record("claim", "tar_shards", metrics={**book.rows(kind="claim", name="amp_speedup")[0]["metrics"],
                                                        "measured": "fast", "low": "a", "high": "b"})
    board = claims.scoreboard()
    err = capsys.readouterr().err
    assert f"ledger row {missing} (claim channels_last_speedup) left out of the claims: a claim's field is " \
           "missing" in err
    assert f"ledger row {wrong} (claim tar_shards) left out of the claims:" in err
    assert [item["verdict"] for item in board if item["key"] == "amp_speedup"] == [claims.HOLDS]
    assert cli.main(["claims"]) == 0
    root = tmp_path / "reference"
    (root / "machine-a").mkdir(parents=True)
    (root / "machine-a" / "03.json").write_text(json.dumps({"notebook": "03", "claims": "not a list"}))
    (root / "machine-a" / "04.json").write_text("[1, 2]")
    monkeypatch.setattr(reference, "folder", lambda: root)
    assert reference.find("03") is None and reference.find("04") is None
    err = capsys.readouterr().err
    assert "03.json cannot be read (wrong type for claims)" in err and "04.json cannot be read (it holds a JSON " \
                                                                       "list, not an object)" in err
    assert cli.main(["reference", "list"]) == 0


def test_the_registry_is_data_and_a_wrong_entry_names_the_file_and_the_fields():
    import tomllib

    with open(claims.REGISTRY, "rb") as file:
        data = tomllib.load(file)
    assert list(data["numeric"]) == list(claims.ARTICLE_CLAIMS) and list(data["rules"]) == list(claims.RULES)
    assert set(claims.RULES) <= set(claims.QUALITATIVE_CLAIMS)
    assert claims.WORTH_HAVING in claims.RULES["swa_gain"].why and "{" not in "".join(r.why for r in claims.RULES.values())
    with pytest.raises(ValueError, match=r"claims_registry.toml: claim typo has fields \['article', 'sectoin'\]"):
        claims._article_claims({"typo": {"article": "A1", "sectoin": "1"}})
