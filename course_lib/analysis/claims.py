"""Every number the two source articles assert, and one record for "claimed vs. measured".

`ARTICLE_CLAIMS` holds the articles' numeric claims (article, section, the claimed value or range,
its unit, and the notebook that measures it), `QUALITATIVE_CLAIMS` those without a number and `RULES` how an
interval decides them; all three are read from the data file `claims_registry.toml` beside this module. A notebook turns a measurement into a `Claim` with
`measured(key, value, interval)` (the verdict comes from comparing the interval with the claimed
range) or `not_measurable(key, reason)`, and `show([...])` writes each claim to the ledger and returns
the table. `scoreboard()` reads the newest measurement of every claim per machine back from the ledger
(`workbook claims`, and a section of the run report).

Verdicts (exactly one per measurement, `VERDICTS`):
- "holds": the measured interval (or the value, without one) meets the claimed range and, for a claim
  of an effect, excludes "no effect" (`ArticleClaim.no_effect`: 1.0x, 0 points). An interval that only
  touches the range counts as meeting it: the measurement cannot tell it apart from the claim.
- "refuted": the interval lies wholly outside the claimed range (whether or not it contains "no
  effect": a speed-up of [0.9x, 1.3x] refutes "1.5-3x").
- "not shown beyond noise" (inconclusive): the interval overlaps the claimed range but also contains
  "no effect", so this measurement cannot tell the claim from nothing having changed.
- "not measurable here", with the reason (no GPU, one disk, data absent ...).
A claim the notebook checks itself (`checked`: a qualitative claim, or a test that is not a range)
holds when the check passes and is refuted when it fails; a check that was inconclusive (the
notebook's interval contains "no effect", see `beyond_noise`) passes None and reads "not shown beyond
noise".

Each measurement is recorded with the profile it ran in (the ledger's profile column: the runner's
`WORKBOOK_PROFILE`, or `show(..., profile=)`; rows without one read "unknown"). A smoke-profile run is
a check that the notebook runs, with a few steps on tiny inputs: `scoreboard` lists its verdicts apart
as "smoke: not evidence" and leaves them out of the counts.

`accuracy_counts` counts, per accuracy chapter (`ACCURACY_CLAIMS`: notebooks 03, 06, 07, 08, 09, 10, 12, 13 and 15),
how many accuracy verdicts are conclusive (holds or refuted) and how many inconclusive, for the reader's
newest measurements or for the committed reference results; `workbook claims` and the run report show it.
"""
from __future__ import annotations

import math
import os
import sys
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from course_lib.analysis import reference  # no torch: ledger and machine are imported where used (they import it)
from course_lib.config import resolve_profile

HOLDS, REFUTED, NOT_SHOWN, NOT_MEASURABLE = "holds", "refuted", "not shown beyond noise", "not measurable here"
# Shown, not measured: a check that holds by construction (the engine's scheduler against its own formula,
# a property of the installed wheel, the article's own arithmetic). Listed and counted apart from the
# verdicts: it teaches, but it is no evidence for or against a claim.
DEMONSTRATED = "demonstrated (shown, not measured)"
VERDICTS = (HOLDS, REFUTED, NOT_SHOWN, NOT_MEASURABLE, DEMONSTRATED)
NOT_MEASURED = "not measured yet"  # scoreboard only: no measurement in the ledger
SMOKE = "smoke: not evidence"  # scoreboard only: a smoke-profile measurement, listed apart and not counted
SMOKE_PROFILE, UNKNOWN_PROFILE = "smoke", "unknown"
# Profiles that check that the notebooks run, at smoke sizes: their measurements are no evidence (the
# rehearsal is the smoke profile with the gpu profile's switches).
CHECK_PROFILES = (SMOKE_PROFILE, "rehearsal")
LEDGER_KIND = "claim"

ARTICLES = {
    "A1": "GPU算力服务器上CNN图像分类训练优化实战指南：从硬件到精度调优 (CNN image classification on GPU servers)",
    "A2": "GPU服务器如何高效训练ImageNet数据集 (training ImageNet efficiently on GPU servers)",
}


@dataclass(frozen=True)
class ArticleClaim:
    """One number an article asserts. `low`/`high` bound the claimed value in `unit` (None: open side)."""

    key: str
    article: str  # key of ARTICLES
    section: str  # the article's own section number
    statement: str  # what the article says, in English
    low: float | None
    high: float | None
    unit: str  # "x" (ratio), "%" (percent change or share), "points" (accuracy points), "GB", "cores", ...
    notebook: str  # the notebook that measures it, "02"
    # The value that means "no effect" (1.0 for a speed-up ratio, 0 for a gain in points or percent; None
    # for a level such as memory in GB). A claim of an effect holds only when the measured interval
    # excludes it: an interval that contains both the claim and "nothing changed" has not shown the claim.
    no_effect: float | None = None

    @property
    def claimed(self) -> str:
        low, high = format_value(self.low, self.unit), format_value(self.high, self.unit)
        if self.low is None or self.high is None:
            return "(not quantified)" if self.low == self.high else f">= {low}" if self.high is None else f"<= {high}"
        return f"about {low}" if self.low == self.high else f"{low} to {high}"


# The claims themselves are data: `claims_registry.toml` beside this module holds the articles' numeric claims
# (ARTICLE_CLAIMS, in the order the first article makes them), the qualitative ones per notebook
# (QUALITATIVE_CLAIMS: the same Claim shape, without a claimed range; `checked` or `decided` gives their verdicts)
# and the rules that decide the latter (RULES, below). A new claim is a new table there.
REGISTRY = Path(__file__).with_name("claims_registry.toml")
CLAIM_FIELDS = {"article", "section", "statement", "low", "high", "unit", "notebook", "no_effect"}


def _article_claims(table: dict) -> dict[str, ArticleClaim]:
    """{key: ArticleClaim} of one section of the registry, each entry's fields checked by name."""
    found = {}
    for key, entry in table.items():
        unknown = set(entry) - CLAIM_FIELDS
        if unknown or not {"article", "section", "statement", "notebook"} <= set(entry):
            raise ValueError(f"{REGISTRY.name}: claim {key} has fields {sorted(entry)}; allowed: "
                             f"{sorted(CLAIM_FIELDS)}, article, section, statement and notebook required")
        found[key] = ArticleClaim(key, entry["article"], str(entry["section"]), entry["statement"], entry.get("low"),
                                  entry.get("high"), entry.get("unit", ""), entry["notebook"], entry.get("no_effect"))
    return found


with open(REGISTRY, "rb") as _file:
    _REGISTRY = tomllib.load(_file)
ARTICLE_CLAIMS: dict[str, ArticleClaim] = _article_claims(_REGISTRY["numeric"])
QUALITATIVE_CLAIMS: dict[str, ArticleClaim] = _article_claims(_REGISTRY["qualitative"])


# How an interval decides a qualitative claim (issue 51): one rule per claim, its margin in its unit, and the
# reason for the margin. The rule is stated before any run, so a null effect becomes a conclusion once the
# interval is narrow enough (equivalence testing, TOST), and no verdict can hold on "no effect":
# - "gain" (X helps): holds when the whole interval lies above 0 and reaches the margin, the smallest effect
#   worth having; refuted when it lies wholly below the margin (within +-margin, or below 0: one-sided TOST).
# - "loss" (X hurts): the mirror of "gain": holds below 0 reaching -margin, refuted wholly above -margin.
# - "change" (X changes Y, either way): holds when the interval excludes 0 and reaches past +-margin on that
#   side, refuted when it lies wholly within +-margin.
# - "non-inferior" (X is not worse): holds when the whole interval lies above -margin, refuted wholly below.
# - "at most" (X adds at most the margin, or is not much better): holds when the whole interval lies below
#   the margin, refuted wholly above it.
GAIN, LOSS, CHANGE, NON_INFERIOR, AT_MOST = "gain", "loss", "change", "non-inferior", "at most"
RULE_KINDS = (GAIN, LOSS, CHANGE, NON_INFERIOR, AT_MOST)
# One converged EuroSAT model's seed-to-seed spread: the speed-run recipe's 5 seeds on valid, std 0.19 points
# (benchmarks/results/speedrun_speedrun.json); two seeds' spread is the smallest top-1 effect worth having.
WORTH_HAVING = "0.5 points of top-1: about two seeds' spread of a converged EuroSAT model (std 0.19 points)"


@dataclass(frozen=True)
class Rule:
    """How `decided` turns an interval into a verdict: `kind` (RULE_KINDS), `margin` in `unit`, and why."""

    kind: str
    margin: float
    unit: str
    why: str

    def text(self) -> str:
        margin = f"{self.margin:g} {self.unit}"
        return {GAIN: f"holds above 0 reaching +{margin}, refuted wholly below +{margin}",
                LOSS: f"holds below 0 reaching -{margin}, refuted wholly above -{margin}",
                CHANGE: f"holds beyond 0 reaching past +-{margin}, refuted wholly within +-{margin}",
                NON_INFERIOR: f"holds wholly above -{margin}, refuted wholly below -{margin}",
                AT_MOST: f"holds wholly below +{margin}, refuted wholly above +{margin}"}[self.kind] + f" ({self.why})"


RULES: dict[str, Rule] = {
    key: Rule(entry["kind"], float(entry["margin"]), entry["unit"],
              entry["why"].replace("{worth_having}", WORTH_HAVING))
    for key, entry in _REGISTRY["rules"].items()}
_wrong = {key: rule.kind for key, rule in RULES.items() if rule.kind not in RULE_KINDS or key not in QUALITATIVE_CLAIMS}
if _wrong:
    raise ValueError(f"{REGISTRY.name}: rules with an unknown kind or no qualitative claim: {_wrong}")


def decide(rule: Rule, low: float, high: float) -> str:
    """The verdict of `rule` on the interval [low, high] (see `RULES` for the kinds)."""
    margin = rule.margin
    if rule.kind == LOSS:  # the mirror image of a gain
        low, high = -high, -low
    if rule.kind in (GAIN, LOSS):
        return REFUTED if high < margin else HOLDS if low > 0 else NOT_SHOWN
    if rule.kind == CHANGE:
        if -margin < low and high < margin:
            return REFUTED
        return HOLDS if (low > 0 and high >= margin) or (high < 0 and low <= -margin) else NOT_SHOWN
    if rule.kind == NON_INFERIOR:
        return HOLDS if low > -margin else REFUTED if high < -margin else NOT_SHOWN
    if rule.kind == AT_MOST:
        return HOLDS if high < margin else REFUTED if low > margin else NOT_SHOWN
    raise ValueError(f"rule kind {rule.kind!r}: use one of {', '.join(RULE_KINDS)}")


def combine(*verdicts: str) -> str:
    """A claim about several things at once (accuracy and speed): it holds only when every part holds, is
    refuted when one part is, and is otherwise not shown (a part not measurable makes it not measurable)."""
    if REFUTED in verdicts:
        return REFUTED
    if NOT_MEASURABLE in verdicts:
        return NOT_MEASURABLE
    return HOLDS if all(verdict == HOLDS for verdict in verdicts) else NOT_SHOWN


def format_value(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.0f}%" if abs(value) >= 10 else f"{value:.1f}%"
    if unit == "points":
        return f"{value:+.2f} points"
    if unit == "of the cores":
        return f"{value:.0%} of the cores"
    return f"{value:.3g} {unit}".rstrip()


@dataclass
class Claim:
    """A claim as measured on one machine: the article's side, the measurement, and the verdict."""

    key: str
    statement: str
    source: str  # "A1 §4.1"
    claimed: str
    unit: str
    measured: float | None  # in `unit`; None when not measurable here
    low: float | None  # the measurement's interval (confidence interval, or the span of repeats)
    high: float | None
    verdict: str  # one of VERDICTS
    reason: str  # how it was measured, or why it could not be
    hardware: str
    notebook: str

    def row(self) -> dict:
        interval = (f"[{format_value(self.low, self.unit)}, {format_value(self.high, self.unit)}]"
                    if self.low is not None and self.high is not None else "-")
        return {"claim": self.statement, "source": self.source, "claimed": self.claimed,
                "measured": format_value(self.measured, self.unit) if self.measured is not None else "-",
                "interval": interval, "verdict": self.verdict, "how / why": self.reason}


def article_claim(key: str) -> ArticleClaim:
    found = ARTICLE_CLAIMS.get(key) or QUALITATIVE_CLAIMS.get(key)
    if found is None:
        raise KeyError(f"unknown claim {key!r}; the claims are: {', '.join([*ARTICLE_CLAIMS, *QUALITATIVE_CLAIMS])}")
    return found


def judge(claim: ArticleClaim, value: float, low: float | None = None, high: float | None = None) -> str:
    """REFUTED when [low, high] (or the value alone) lies wholly outside the claimed range; else HOLDS
    when, for a claim of an effect, it also excludes "no effect", and NOT_SHOWN when it contains it."""
    if claim.low is None and claim.high is None:
        raise ValueError(f"claim {claim.key} has no number to compare with; use checked(key, holds, reason)")
    low, high = (value if low is None else low), (value if high is None else high)
    # A range bound that equals "no effect" is open ("beats": > 0); any other bound is closed.
    above = claim.low is None or (high > claim.low if claim.low == claim.no_effect else high >= claim.low)
    below = claim.high is None or (low < claim.high if claim.high == claim.no_effect else low <= claim.high)
    if not (above and below):
        return REFUTED
    return NOT_SHOWN if contains_no_effect(claim, low, high) else HOLDS


def contains_no_effect(claim: ArticleClaim, low: float, high: float) -> bool:
    """Whether [low, high] contains the claim's "no effect" value (never, for a claim of a level)."""
    return claim.no_effect is not None and low <= claim.no_effect <= high


def beyond_noise(low: float, high: float, no_effect: float = 0.0) -> bool | None:
    """For `checked`: True when the interval of a claimed gain lies wholly above `no_effect`, False when wholly
    below it (refuted), None when it contains it (not shown beyond noise)."""
    return True if low > no_effect else False if high < no_effect else None


def measured(key: str, value: float, interval: tuple[float, float] | None = None, reason: str = "",
             hardware: str | None = None) -> Claim:
    """A claim measured here: `value` in the claim's unit, `interval` its (low, high) uncertainty."""
    claim = article_claim(key)
    if value is None or not math.isfinite(value):
        raise ValueError(f"claim {key}: measured value must be a finite number, got {value!r}; "
                         "use not_measurable(key, reason) when it cannot be measured")
    low, high = interval if interval is not None else (None, None)
    if low is not None and not low <= value <= high:
        raise ValueError(f"claim {key}: the interval [{low}, {high}] must contain the value {value}")
    verdict = judge(claim, value, low, high)
    if verdict == NOT_SHOWN:
        no_effect = format_value(claim.no_effect, claim.unit).replace("+", "")
        reason = f"{reason}; the interval contains {no_effect} (no effect): not shown beyond noise".lstrip("; ")
    return _claim(claim, value, low, high, verdict, reason, hardware)


def checked(key: str, holds: bool | None, reason: str, value: float | None = None,
            interval: tuple[float, float] | None = None, hardware: str | None = None) -> Claim:
    """A claim the notebook decides itself ("within seed noise", "bit-identical"), `reason` saying what was tested:
    `holds` True, False or None (inconclusive, e.g. `beyond_noise`) reads HOLDS, REFUTED or NOT_SHOWN."""
    claim = article_claim(key)
    if not reason:
        raise ValueError(f"claim {key}: say what was measured to decide it")
    low, high = interval if interval is not None else (None, None)
    return _claim(claim, value, low, high, NOT_SHOWN if holds is None else HOLDS if holds else REFUTED, reason,
                  hardware)


def decided(key: str, value: float, interval: tuple[float, float] | None, reason: str,
            hardware: str | None = None, also: str | None = None) -> Claim:
    """A qualitative claim decided by its rule (`RULES[key]`) from `value` and its 95% `interval` in the rule's unit,
    `combine`d with `also`, the verdict of a second part it makes (a speed beside an accuracy)."""
    if key not in RULES:
        raise KeyError(f"claim {key!r} has no rule; the claims with one are: {', '.join(RULES)}")
    rule, claim = RULES[key], article_claim(key)
    if value is None or not math.isfinite(value):
        raise ValueError(f"claim {key}: measured value must be a finite number, got {value!r}")
    low, high = (value, value) if interval is None else (float(interval[0]), float(interval[1]))
    verdict = decide(rule, low, high)
    if also is not None:
        verdict = combine(verdict, also)
    return _claim(claim, value, *((None, None) if interval is None else (low, high)), verdict,
                  f"{reason}; rule: {rule.text()}", hardware, rule.unit)


def demonstrated(key: str, shown: bool, reason: str, value: float | None = None,
                 hardware: str | None = None) -> Claim:
    """A check that holds by construction (a formula against itself, a property of the wheel): DEMONSTRATED, or
    REFUTED when even that failed (a bug to report); counted apart, never as evidence for the article."""
    claim = article_claim(key)
    if not reason:
        raise ValueError(f"claim {key}: say what was shown")
    return _claim(claim, value, None, None, DEMONSTRATED if shown else REFUTED, reason, hardware)


def not_measurable(key: str, reason: str, hardware: str | None = None) -> Claim:
    """A claim this machine cannot test, with the reason (and what it could measure instead)."""
    claim = article_claim(key)
    if not reason:
        raise ValueError(f"claim {key}: say why it is not measurable here")
    return _claim(claim, None, None, None, NOT_MEASURABLE, reason, hardware)


def _claim(claim: ArticleClaim, value, low, high, verdict: str, reason: str, hardware: str | None,
           unit: str | None = None) -> Claim:
    """The Claim of the registry's `claim` measured here (this machine's hardware line unless given)."""
    def number(x):
        return None if x is None else float(x)

    return Claim(claim.key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, unit or claim.unit,
                 number(value), number(low), number(high), verdict, reason, hardware or _hardware(), claim.notebook)


def _hardware() -> str:  # a seam: tests name their machine here
    from course_lib import machine

    return machine.describe_hardware()


def record(claims: list[Claim], profile: str | None = None) -> None:
    """Write each claim to the ledger (kind "claim", name = its key), with the profile it was measured
    in: `profile`, else the runner's WORKBOOK_PROFILE (the ledger's own default), else none ("unknown")."""
    from course_lib import ledger

    profile = _resolved(profile)
    for claim in claims:
        ledger.record(LEDGER_KIND, claim.key, status="ok", parameters={"hardware_line": claim.hardware},
                      metrics={k: v for k, v in asdict(claim).items() if k not in ("key", "hardware")},
                      profile=profile)


def _resolved(profile: str | None) -> str | None:
    return None if profile is None else resolve_profile(profile)  # "auto" -> the cpu or gpu it stands for


def table(claims: list[Claim]):
    """The claims as a DataFrame: claim, source, claimed, measured, interval, verdict, how / why."""
    import pandas as pd

    return pd.DataFrame([c.row() for c in claims]).set_index("claim")


SMOKE_RUN = "smoke run: not evidence"  # a smoke-profile table's verdict column: no verdict, not even as measured


def show(claims: list[Claim], profile: str | None = None):
    """Record the claims (`record`), print their machine and return the table, with the committed reference's value,
    interval and verdict in columns beside the reader's (`analysis.reference`). In the smoke profile (`profile`,
    else WORKBOOK_PROFILE) each verdict reads "smoke run: not evidence", under a line saying why."""
    from course_lib import ledger

    record(claims, profile)
    hardware = sorted({c.hardware for c in claims})
    print("measured on: " + "; ".join(hardware) + " (your run)")
    shown = table(claims)
    if (_resolved(profile) or os.environ.get(ledger.PROFILE_ENV)) in CHECK_PROFILES:
        print("smoke run: a check that the chapter runs (a few steps on tiny inputs), not evidence for or against "
              "any claim; run the cpu or gpu profile for verdicts")
        shown["verdict"] = SMOKE_RUN
    shown, found = _beside_reference(claims, shown) if claims else (shown, None)
    notebooks = ", ".join(sorted({c.notebook for c in claims}))
    print(found.line() if found else f"no reference result committed for notebook {notebooks} "
          f"({reference.REFERENCE_FOLDER}/)")
    return shown


def _beside_reference(claims: list[Claim], shown):
    """(`shown` with the committed reference's value, interval and verdict per claim in columns of their own, the
    reference); (`shown`, None) when the claims' notebook has none."""
    notebooks = sorted({claim.notebook for claim in claims})
    try:
        found = reference.find(notebooks[0]) if len(notebooks) == 1 else None
    except reference.ReferenceResultError as error:  # a damaged file: say so, and show the reader's run
        print(error)
        found = None
    if found is None:
        return shown, None
    figures = [_figure(found.claim(claim.key), claim.unit) for claim in claims]
    shown = shown.copy()
    shown["reference measured"] = [figure["measured"] for figure in figures]
    shown["reference interval"] = [figure["interval"] for figure in figures]
    shown["reference verdict"] = [figure["verdict"] for figure in figures]
    return shown, found


def _figure(item: dict | None, unit: str = "") -> dict:
    """A reference's claim as the tables print it: measured, interval and verdict."""
    if item is None:
        return {"measured": "-", "interval": "-", "verdict": "not in the reference"}
    unit = item.get("unit") or unit
    interval = (f"[{format_value(item['low'], unit)}, {format_value(item['high'], unit)}]"
                if item.get("low") is not None and item.get("high") is not None else "-")
    return {"measured": format_value(item["measured"], unit) if item.get("measured") is not None else "-",
            "interval": interval, "verdict": item.get("verdict")}


LEGACY_DOES_NOT_HOLD = "does not hold"  # the one negative verdict of ledgers written before issue 24


def _current_verdict(claim: ArticleClaim, item: dict) -> str:
    """A ledger row's verdict in today's words: before issue 24 "does not hold" meant refuted or "contains no
    effect", so a measured numeric claim is judged again; a failed check (no number to judge) was refuted."""
    verdict = item["verdict"]
    if verdict != LEGACY_DOES_NOT_HOLD:
        return verdict
    if (claim.low is None and claim.high is None) or item.get("measured") is None:
        return REFUTED
    again = judge(claim, item["measured"], item.get("low"), item.get("high"))
    return REFUTED if again == HOLDS else again  # HOLDS again: a numeric claim the notebook's check failed


def _claim_fields(metrics) -> dict | None:
    """The fields `record` writes for a claim (a Claim's, less its key and hardware) out of a claim row's
    `metrics`, other keys left aside; None when one is missing (a row written by hand or by another tool)."""
    expected = [f.name for f in fields(Claim) if f.name not in ("key", "hardware")]
    if not isinstance(metrics, dict) or any(name not in metrics for name in expected):
        return None
    return {name: metrics[name] for name in expected}


def _skip_row(row: dict, why: str) -> None:
    print(f"workbook: warning: ledger row {row.get('id')} (claim {row.get('name')}) left out of the claims: {why}",
          file=sys.stderr)


def scoreboard(book=None) -> list[dict]:
    """Every claim with its newest ledger measurement per machine, in the registry's order (a numeric one not yet
    measured once as NOT_MEASURED). A smoke-profile measurement is kept apart (its own newest per machine, so it
    never hides a real run): verdict SMOKE, `evidence` False, the verdict as measured in `verdict_as_measured`."""
    from course_lib import ledger, machine

    book = book or ledger.Ledger()
    references: dict = {}  # notebook -> its committed reference (analysis.reference), or None
    newest: dict[tuple[str, str, bool], dict] = {}
    for row in book.rows(kind=LEDGER_KIND):  # newest first
        claim_fields = _claim_fields(row["metrics"])
        if claim_fields is None:
            _skip_row(row, "a claim's field is missing from its metrics")
            continue
        hardware = row["parameters"].get("hardware_line") or machine.describe_hardware(row["hardware"])
        profile = row.get("profile") or UNKNOWN_PROFILE
        newest.setdefault((row["name"], hardware, profile in CHECK_PROFILES),
                          {**claim_fields, "hardware": hardware, "profile": profile,
                           "created_at": row["created_at"], "run_id": row["run_id"], "row_id": row["id"]})
    board = []
    for key, claim in {**ARTICLE_CLAIMS, **QUALITATIVE_CLAIMS}.items():
        found = [value for (name, _, smoke), value in newest.items() if name == key and not smoke]
        smoke_runs = [value for (name, _, smoke), value in newest.items() if name == key and smoke]
        if not found and key in ARTICLE_CLAIMS:
            board.append({"key": key, "source": f"{claim.article} §{claim.section}", "statement": claim.statement,
                          "claimed": claim.claimed, "measured": "-", "interval": "-", "verdict": NOT_MEASURED,
                          "reason": f"run notebook {claim.notebook}" + (" outside the smoke profile (only smoke "
                                                                         "runs so far)" if smoke_runs else ""),
                          "notebook": claim.notebook, "hardware": "-", "profile": "-", "evidence": True,
                          "created_at": None, "run_id": None})
        for item in [*found, *smoke_runs]:
            values = {k: v for k, v in item.items() if k not in ("hardware", "profile", "created_at", "run_id", "row_id")}
            try:
                values["verdict"] = _current_verdict(claim, values)
                shown = Claim(key=key, hardware=item["hardware"], **values).row()
            except (TypeError, ValueError, KeyError) as error:  # a row no claim can be made of: one line, go on
                _skip_row({"id": item["row_id"], "name": key}, f"{type(error).__name__}: {error}")
                continue
            entry = {"key": key, **shown,
                     "statement": claim.statement, "reason": item["reason"], "notebook": claim.notebook,
                     "hardware": item["hardware"], "profile": item["profile"],
                     "evidence": item["profile"] not in CHECK_PROFILES,
                     "created_at": item["created_at"], "run_id": item["run_id"]}
            if not entry["evidence"]:
                entry.update(verdict=SMOKE, verdict_as_measured=values["verdict"])
            board.append(entry)
    for entry in board:
        entry["whose"] = "yours"
        entry["reference"] = _reference_of(entry["key"], entry["notebook"], references)
    return board


def _reference_of(key: str, notebook: str, cache: dict) -> dict | None:
    """The committed reference's figure for claim `key` (analysis.reference), for the scoreboard."""
    if notebook not in cache:
        try:
            cache[notebook] = reference.find(notebook)
        except reference.ReferenceResultError:
            cache[notebook] = None
    found = cache[notebook]
    item = found.claim(key) if found else None
    if item is None:
        return None
    return {"whose": "reference", **_figure(item), "hardware": found.hardware,
            "date": found.date, "profile": found.profile, "command": found.command}


# The accuracy claims of the six accuracy chapters (issue 24): those whose measurement is an accuracy, a
# difference of accuracies or a calibration error, not a time, a speed or a memory figure. A verdict on
# one is conclusive when it holds or is refuted (its interval excludes "no effect", or lies wholly
# outside the claimed range), and inconclusive when it is "not shown beyond noise".
ACCURACY_CLAIMS: dict[str, tuple[str, ...]] = {
    "03": ("amp_accuracy",),
    "05": ("syncbn_small_batches",),
    "06": ("adamw_vs_sgd", "adamw_sensitivity", "batch_lr_scaling", "schedule_over_optimizer"),
    "07": ("regularization_remote_sensing", "regularization_cifar10", "mixup_remote_sensing", "ema_steady_gain",
           "too_many_tricks", "label_smoothing_alone", "label_smoothing_calibration", "early_stopping",
           "best_checkpoint_gain", "swa_gain", "augmentation_prevents_overfitting"),
    "08": ("transfer_learning", "transfer_beats_scratch", "transfer_freeze_recipe"),
    "09": ("mixup_helps_09", "imbalance_weighted_loss", "imbalance_sampler"),
    "10": ("casestudy_adamw", "casestudy_regularization", "casestudy_accuracy"),
    "12": ("eurosat_finetuned_reference", "eurosat_scratch_reference", "speedrun_97_in_10_minutes",
           "bigger_model_not_better", "vit_overfits_small_data", "imagenette_leaderboard"),
    "13": ("deploy_distillation", "deploy_pruning", "continual_learning"),
    "15": ("cleaning_recovers_accuracy",),
}
CONCLUSIVE, INCONCLUSIVE = "conclusive", "inconclusive"
ACCURACY_OUTCOMES = (CONCLUSIVE, INCONCLUSIVE, NOT_MEASURABLE, NOT_MEASURED)
_OUTCOMES = {HOLDS: CONCLUSIVE, REFUTED: CONCLUSIVE, NOT_SHOWN: INCONCLUSIVE, NOT_MEASURABLE: NOT_MEASURABLE}


def accuracy_counts(board: list[dict] | None = None, whose: str = "yours", root=None) -> dict[str, dict[str, int]]:
    """Per accuracy notebook (`ACCURACY_CLAIMS`): its accuracy claims conclusive, inconclusive, not measurable, not
    measured, and the total; of the newest evidence on `board` (`scoreboard()`), or with `whose="reference"` of
    the committed reference results (under `root` when given)."""
    if whose not in ("yours", "reference"):
        raise ValueError(f"whose={whose!r}: count 'yours' (the ledger's measurements) or 'reference'")
    verdicts: dict[str, str | None] = {}
    if whose == "yours":
        newest: dict[str, dict] = {}
        for item in scoreboard() if board is None else board:
            if item.get("evidence", True) and item["verdict"] != NOT_MEASURED:
                kept = newest.get(item["key"])
                if kept is None or (item.get("created_at") or "") > (kept.get("created_at") or ""):
                    newest[item["key"]] = item
        verdicts = {key: item["verdict"] for key, item in newest.items()}
    else:
        for notebook, keys in ACCURACY_CLAIMS.items():
            try:
                found = reference.find(notebook, root=root)
            except reference.ReferenceResultError:
                found = None
            verdicts.update({key: (found.claim(key) or {}).get("verdict") for key in keys} if found else {})
    counts = {}
    for notebook, keys in ACCURACY_CLAIMS.items():
        outcomes = [_OUTCOMES.get(verdicts.get(key), NOT_MEASURED) for key in keys]
        counts[notebook] = {**{outcome: outcomes.count(outcome) for outcome in ACCURACY_OUTCOMES},
                            "total": len(keys)}
    return counts


def demonstrations(root=None) -> int:
    """How many claims of the committed reference results are DEMONSTRATED (counted apart from the verdicts)."""
    notebooks = sorted({path.stem for path in (root or reference.folder()).glob("*/*.json")})
    found = (reference.find(notebook, root=root) for notebook in notebooks)
    return sum(item.get("verdict") == DEMONSTRATED for ref in found if ref for item in ref.claims)


def accuracy_counts_table(counts: dict[str, dict[str, int]]) -> str:
    """`accuracy_counts` as the markdown table docs/results.md carries (`workbook docs tables` writes it;
    tests/test_claims.py holds the copy to the committed reference results)."""
    lines = ["| notebook | conclusive | inconclusive | not measurable here | not measured | of |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {notebook} | {count[CONCLUSIVE]} | {count[INCONCLUSIVE]} | {count[NOT_MEASURABLE]} | "
              f"{count[NOT_MEASURED]} | {count['total']} |" for notebook, count in counts.items()]
    return "\n".join(lines)


def accuracy_results_table(root=None) -> str:
    """Every accuracy claim of the committed reference results as docs/results.md's markdown table ("-" where a
    notebook has none yet); `workbook reference table` prints it, tests/test_claims.py holds the copy to the files."""
    lines = ["| notebook | claim | measured | 95% interval | verdict | how it was measured |", "|---|---|---|---|---|---|"]
    for notebook, keys in ACCURACY_CLAIMS.items():
        found = reference.find(notebook, root=root)
        for key in keys:
            item = found.claim(key) if found else None
            figure = _figure(item, article_claim(key).unit)
            reason = (item or {}).get("reason") or ("no reference of this notebook" if found is None else "-")
            lines.append(f"| {notebook} | `{key}` | {figure['measured']} | {figure['interval']} | {figure['verdict']} | "
                         + reason.replace("|", "/").replace("\n", " ") + " |")
    return "\n".join(lines)


def format_accuracy_counts(counts: dict[str, dict[str, int]]) -> str:
    """One line per notebook: "07: 5 of 7 accuracy verdicts conclusive (1 inconclusive, 1 not measurable here)"."""
    lines = []
    for notebook, count in counts.items():
        rest = [f"{count[outcome]} {outcome}" for outcome in ACCURACY_OUTCOMES[1:] if count[outcome]]
        lines.append(f"{notebook}: {count[CONCLUSIVE]} of {count['total']} accuracy verdicts conclusive"
                     + (f" ({', '.join(rest)})" if rest else ""))
    return "\n".join(lines)


def verdict_counts(board: list[dict]) -> dict[str, int]:
    """How many scoreboard items have each verdict, smoke-profile ones left out (they are not evidence);
    DEMONSTRATED has its own count, to be shown apart from the verdicts (`format_scoreboard`)."""
    counted = [item for item in board if item.get("evidence", True)]
    return {verdict: sum(item["verdict"] == verdict for item in counted) for verdict in (*VERDICTS, NOT_MEASURED)}


def format_counts(board: list[dict]) -> str:
    """`verdict_counts` in one line, the demonstrations apart: "3 holds, ..., 19 not measured yet; apart
    from these, 2 demonstrated (shown, not measured)"."""
    counts = verdict_counts(board)
    demonstrations = counts.pop(DEMONSTRATED)
    return (", ".join(f"{count} {verdict}" for verdict, count in counts.items())
            + f"; apart from these, {demonstrations} {DEMONSTRATED}")


def format_scoreboard(board: list[dict]) -> str:
    """Plain text for `workbook claims`: one block per claim and machine, a count of verdicts, then the
    smoke-profile measurements apart (not counted: a smoke run checks that a notebook runs)."""
    lines = []
    evidence = [item for item in board if item.get("evidence", True)]
    smoke = [item for item in board if not item.get("evidence", True)]
    for item in evidence:
        lines.append(f"[{item['notebook']}] {item['key']} ({item['source']}): {item['verdict']}")
        if item["verdict"] == NOT_MEASURED:
            lines.append(f"    claimed {item['claimed']}; {item['reason']}")
        else:
            lines.append(f"    claimed {item['claimed']}; yours: measured {item['measured']}"
                         + (f" {item['interval']}" if item["interval"] != "-" else "")
                         + f" on {item['hardware']}, profile {item.get('profile', UNKNOWN_PROFILE)}")
            if item["reason"]:
                lines.append(f"    {item['reason']}")
        figure = item.get("reference")
        if figure:
            lines.append(f"    reference (not yours): {figure['verdict']}, measured {figure['measured']}"
                         + (f" {figure['interval']}" if figure["interval"] != "-" else "")
                         + f" on {figure['hardware']}, profile {figure['profile']}, {figure['date']}")
    lines.append(format_counts(board))
    for whose in ("yours", "reference"):
        counts = accuracy_counts(board, whose)  # the references' counts: of every committed reference
        if whose == "yours" or any(count[NOT_MEASURED] < count["total"] for count in counts.values()):
            lines.append(f"accuracy verdicts per notebook ({whose}"
                         + (", not your run):" if whose == "reference" else "):"))
            lines += ["    " + line for line in format_accuracy_counts(counts).splitlines()]
    if smoke:
        lines.append(f"{SMOKE} ({len(smoke)} measurement(s) of the smoke profile, left out of the counts):")
        lines += [f"    [{item['notebook']}] {item['key']}: measured {item['measured']}"
                  + (f" {item['interval']}" if item["interval"] != "-" else "")
                  + f" on {item['hardware']}" for item in smoke]
    return "\n".join(lines)
