"""Every number the two source articles assert, and one record for "claimed vs. measured".

`ARTICLE_CLAIMS` holds the articles' 20 numeric claims (article, section, the claimed value or range,
its unit, and the notebook that measures it). A notebook turns a measurement into a `Claim` with
`measured(key, value, interval)` (the verdict comes from comparing the interval with the claimed
range) or `not_measurable(key, reason)`, and `show([...])` writes each claim to the ledger and returns
the table. `scoreboard()` reads the newest measurement of every claim per machine back from the ledger
(`workbook claims`, and a section of the run report).

Verdicts: "holds" when the measured interval (or value, without one) meets the claimed range,
"does not hold" when it lies wholly outside it, "not measurable here" with the reason (no GPU,
one disk, data absent ...). An interval that only touches the range still counts as holding: the
measurement cannot tell it apart from the claim, which is what an honest reader wants to know.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

HOLDS, DOES_NOT_HOLD, NOT_MEASURABLE, NOT_MEASURED = "holds", "does not hold", "not measurable here", "not measured yet"
VERDICTS = (HOLDS, DOES_NOT_HOLD, NOT_MEASURABLE)
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
        if self.low is None and self.high is None:
            return "(not quantified)"
        if self.low is not None and self.high is not None and self.low != self.high:
            return f"{format_value(self.low, self.unit)} to {format_value(self.high, self.unit)}"
        if self.low is not None and self.high is not None:
            return f"about {format_value(self.low, self.unit)}"
        if self.low is not None:
            return f">= {format_value(self.low, self.unit)}"
        return f"<= {format_value(self.high, self.unit)}"


def _claim(key, article, section, statement, low, high, unit, notebook, no_effect=None):
    return key, ArticleClaim(key, article, section, statement, low, high, unit, notebook, no_effect)


# The articles' numeric claims, in the order the first article makes them. Where an article gives one
# number ("about 2x"), the range is that number +-25%: "about" is not a point.
ARTICLE_CLAIMS: dict[str, ArticleClaim] = dict([
    _claim("gpu_starved_utilisation", "A1", "1.1", "a data-starved GPU is busy only 30-50% of the time", 30, 50,
           "%", "02"),
    _claim("cpu_cores_per_gpu", "A1", "1.1", "one training GPU needs at least 16 physical CPU cores", 16, None,
           "cores", "02"),
    _claim("nvme_vs_sata", "A1", "1.1", "SATA SSD -> NVMe SSD cuts an epoch's data-reading time by about 60%",
           45, 75, "%", "02", no_effect=0),
    _claim("resnet50_amp_memory", "A1", "1.3", "ResNet-50, 224 px, batch 256, mixed precision needs 12-16 GB",
           12, 16, "GB", "01"),
    _claim("dataloader_tuning", "A1", "3", "tuning the DataLoader alone made training about 3x faster", 2.25, 3.75,
           "x", "02", no_effect=1),
    _claim("num_workers_knee", "A1", "3.1", "throughput stops growing at about half the physical cores "
           "(8-16 workers on 32 cores)", 0.25, 0.5, "of the cores", "02"),
    _claim("pin_memory", "A1", "3.1", "pin_memory=True raises throughput by 5-15%", 5, 15, "%", "02", no_effect=0),
    _claim("opencv_decode", "A1", "3.2", "OpenCV imdecode decodes JPEG about 2x faster than PIL", 1.5, 2.5,
           "x", "02", no_effect=1),
    _claim("tar_shards", "A1", "3.4", "tar shards read 5-10x faster than loose files (hundreds/s -> 2-3 thousand/s)",
           5, 10, "x", "02", no_effect=1),
    _claim("amp_speedup", "A1", "4.1", "mixed precision trains 1.5-3x faster", 1.5, 3, "x", "03", no_effect=1),
    _claim("amp_memory", "A1", "4.1", "mixed precision needs about half the memory", 0.4, 0.6, "x", "03", no_effect=1),
    _claim("amp_second_article", "A2", "mixed precision", "mixed precision trains 1.5-2x faster at almost "
           "unchanged accuracy", 1.5, 2, "x", "03", no_effect=1),
    _claim("torch_compile", "A1", "7", "torch.compile raises CNN throughput by 10-30%", 10, 30, "%", "03", no_effect=0),
    _claim("ddp_efficiency", "A1", "4.4", "4-GPU DDP reaches at least 85% scaling efficiency", 85, None, "%", "05"),
    _claim("adamw_vs_sgd", "A1", "5.2", "AdamW beats SGD and is less sensitive to the learning rate and seed "
           "(accuracy of AdamW minus SGD, mean over learning rates and seeds)", 0, None, "points", "06", no_effect=0),
    _claim("regularization_remote_sensing", "A1", "5.3", "label smoothing 0.1 + MixUp 0.2 + light Random Erasing "
           "add about 1.5 points on a remote-sensing set", 1.0, 2.0, "points", "07", no_effect=0),
    _claim("regularization_cifar10", "A1", "5.3", "the same combination adds about 0.8 points on CIFAR-10",
           0.5, 1.1, "points", "07", no_effect=0),
    _claim("mixup_remote_sensing", "A1", "6.4", "MixUp helps remote-sensing images more than others (gain on "
           "remote sensing minus gain on a non-remote-sensing control)", 0, None, "points", "07", no_effect=0),
    _claim("transfer_learning", "A1", "5.4", "fine-tuning pretrained weights reaches from-scratch accuracy with "
           "about 80% less training", 60, 100, "%", "08", no_effect=0),
    _claim("case_study_speedup", "A1", "6", "the four stages cut total training time to about 1/16", 12, 20,
           "x", "10", no_effect=1),
])

# Claims the articles make without a number (or that the notebooks add as context): the same Claim
# shape, shown in each notebook's table, listed after the numeric ones by `scoreboard`. Each notebook
# adds its own under its marker; `checked(key, holds, reason)` gives their verdicts.
QUALITATIVE_CLAIMS: dict[str, ArticleClaim] = dict([  # noqa: C406 (filled per notebook below)
    # notebook 00
    # notebook 01
    # notebook 02
    # notebook 03
    # notebook 04
    # notebook 05
    # notebook 06
    # notebook 07
    # notebook 08
    # notebook 09
    # notebook 10
    # notebook 11
    # notebook 12
    # notebook 13
])


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
    return f"{value:.3g} {unit}"


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
    """HOLDS when [low, high] (or the value alone) meets the claimed range and, for a claim of an
    effect, excludes "no effect" (the effect is beyond noise), else DOES_NOT_HOLD."""
    if claim.low is None and claim.high is None:
        raise ValueError(f"claim {claim.key} has no number to compare with; use checked(key, holds, reason)")
    low, high = (value if low is None else low), (value if high is None else high)
    above = claim.low is None or (high > claim.low if claim.low == claim.no_effect else high >= claim.low)
    below = claim.high is None or (low < claim.high if claim.high == claim.no_effect else low <= claim.high)
    return HOLDS if above and below and not contains_no_effect(claim, low, high) else DOES_NOT_HOLD


def contains_no_effect(claim: ArticleClaim, low: float, high: float) -> bool:
    """Whether [low, high] contains the claim's "no effect" value (never, for a claim of a level)."""
    return claim.no_effect is not None and low <= claim.no_effect <= high


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
    if low is not None and contains_no_effect(claim, low, high):
        no_effect = format_value(claim.no_effect, claim.unit).replace("+", "")
        reason = f"{reason}; the interval contains {no_effect} (no effect): not shown beyond noise".lstrip("; ")
    return Claim(key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, claim.unit, float(value),
                 None if low is None else float(low), None if high is None else float(high),
                 judge(claim, value, low, high), reason, hardware or _hardware(), claim.notebook)


def checked(key: str, holds: bool, reason: str, value: float | None = None,
            interval: tuple[float, float] | None = None, hardware: str | None = None) -> Claim:
    """A claim whose verdict the notebook decides itself (a qualitative claim, or a test that is not a
    range: "within seed noise", "bit-identical"); `reason` says what was tested."""
    claim = article_claim(key)
    if not reason:
        raise ValueError(f"claim {key}: say what was measured to decide it")
    low, high = interval if interval is not None else (None, None)
    return Claim(key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, claim.unit,
                 None if value is None else float(value), low, high, HOLDS if holds else DOES_NOT_HOLD, reason,
                 hardware or _hardware(), claim.notebook)


def not_measurable(key: str, reason: str, hardware: str | None = None) -> Claim:
    """A claim this machine cannot test, with the reason (and what it could measure instead)."""
    claim = article_claim(key)
    if not reason:
        raise ValueError(f"claim {key}: say why it is not measurable here")
    return Claim(key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, claim.unit, None, None,
                 None, NOT_MEASURABLE, reason, hardware or _hardware(), claim.notebook)


def _hardware() -> str:
    from course_lib import ledger

    return ledger.describe_hardware()


def record(claims: list[Claim]) -> None:
    """Write each claim to the ledger (kind "claim", name = its key)."""
    from course_lib import ledger

    for claim in claims:
        ledger.record(LEDGER_KIND, claim.key, status="ok", parameters={"hardware_line": claim.hardware},
                      metrics={k: v for k, v in asdict(claim).items() if k not in ("key", "hardware")})


def table(claims: list[Claim]):
    """The claims as a DataFrame: claim, source, claimed, measured, interval, verdict, how / why."""
    import pandas as pd

    return pd.DataFrame([c.row() for c in claims]).set_index("claim")


def show(claims: list[Claim]):
    """Record the claims in the ledger, print the machine they were measured on, return the table."""
    record(claims)
    hardware = sorted({c.hardware for c in claims})
    print("measured on: " + "; ".join(hardware))
    return table(claims)


def scoreboard(book=None) -> list[dict]:
    """Every article claim with its newest measurement per machine (from the ledger), in the
    registry's order: the numeric claims (one without a measurement yet appears once as NOT_MEASURED),
    then the qualitative ones that were measured."""
    from course_lib import ledger

    book = book or ledger.Ledger()
    newest: dict[tuple[str, str], dict] = {}
    for row in book.rows(kind=LEDGER_KIND):  # newest first
        hardware = row["parameters"].get("hardware_line") or ledger.describe_hardware(row["hardware"])
        newest.setdefault((row["name"], hardware), {**row["metrics"], "hardware": hardware,
                                                     "created_at": row["created_at"], "run_id": row["run_id"]})
    board = []
    for key, claim in {**ARTICLE_CLAIMS, **QUALITATIVE_CLAIMS}.items():
        found = [value for (name, _), value in newest.items() if name == key]
        if not found and key in ARTICLE_CLAIMS:
            board.append({"key": key, "source": f"{claim.article} §{claim.section}", "statement": claim.statement,
                          "claimed": claim.claimed, "measured": "-", "interval": "-", "verdict": NOT_MEASURED,
                          "reason": f"run notebook {claim.notebook}", "notebook": claim.notebook, "hardware": "-",
                          "created_at": None, "run_id": None})
        for item in found:
            fields = {k: v for k, v in item.items() if k not in ("hardware", "created_at", "run_id")}
            board.append({"key": key, **Claim(key=key, hardware=item["hardware"], **fields).row(),
                          "statement": claim.statement, "reason": item["reason"], "notebook": claim.notebook,
                          "hardware": item["hardware"], "created_at": item["created_at"], "run_id": item["run_id"]})
    return board


def format_scoreboard(board: list[dict]) -> str:
    """Plain text for `workbook claims`: one block per claim and machine, and a count of verdicts."""
    lines = []
    for item in board:
        lines.append(f"[{item['notebook']}] {item['key']} ({item['source']}): {item['verdict']}")
        if item["verdict"] == NOT_MEASURED:
            lines.append(f"    claimed {item['claimed']}; {item['reason']}")
            continue
        lines.append(f"    claimed {item['claimed']}; measured {item['measured']}"
                     + (f" {item['interval']}" if item["interval"] != "-" else "") + f" on {item['hardware']}")
        if item["reason"]:
            lines.append(f"    {item['reason']}")
    counts = {verdict: sum(item["verdict"] == verdict for item in board) for verdict in (*VERDICTS, NOT_MEASURED)}
    lines.append(", ".join(f"{count} {verdict}" for verdict, count in counts.items()))
    return "\n".join(lines)
