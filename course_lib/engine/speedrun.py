"""Time to accuracy: train a config under a wall-clock budget and record validation accuracy against
seconds, the way speed-runs are scored (DAWNBench, Coleman et al. 2017; airbench, arXiv:2404.00498).

The clock starts before the data is built, so decoding and caching count, and it pauses while the
curve's validation points are measured (measurement is not training; the final prediction, with its
test-time augmentation, counts). `race` drives the engine's own `prepare` / `train_one_epoch` /
`validate`, so a race measures exactly what `workbook train` does. `workbook speedrun` is its
command line.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable

from course_lib import ledger
from course_lib.config import Config, ConfigError
from course_lib.data.batches import validation_batches
from course_lib.engine import train

MILESTONES = (0.90, 0.95, 0.97)  # validation top-1 levels whose time the tables report
VALID_SPLIT = "EuroSAT's valid split (no choice made on it)"  # what a reported race was scored on
CARVE_OUT_SPLIT = "a fixed carve-out of train (choosing)"
SAMPLE_SPLIT = "the committed sample's val split (a check)"


def split_label(config: Config, real_data: bool) -> str:
    """What a race of `config` is scored on, as results files and tables name it: the carve-out of train a
    choice is made on, EuroSAT's valid split (reporting), or the committed sample's val split."""
    if config.validation_from == "train":
        return CARVE_OUT_SPLIT
    return VALID_SPLIT if real_data else SAMPLE_SPLIT


@dataclasses.dataclass
class RaceResult:
    label: str
    config: Config
    curve: list[dict]  # per epoch: seconds (clock), epoch (fractional), val_top1 and val_loss (one view), train_loss, images/s
    setup_seconds: float  # data building (decoding, caching) and model setup, inside the clock
    seconds: float  # the clock at the end, the final prediction included
    val_top1: float  # final validation top-1, with the config's test-time augmentation (curve[-1]: one view)
    test_top1: float | None  # the held-out split's top-1 when the data has one
    precision: str
    images_per_second: float  # training images per second of the last epoch
    num_classes: int = 0  # of the data raced on, to count the model's FLOPs for MFU
    val_images: int = 0  # images the final top-1 was measured on (its binomial interval)
    val_top5: float | None = None  # final validation top-5, with the config's test-time augmentation
    test_top5: float | None = None  # the held-out split's top-5 when the data has one

    def time_to(self, accuracy: float) -> float | None:
        """Seconds on the clock when validation top-1 first reached `accuracy` (None: never)."""
        return next((point["seconds"] for point in self.curve if point["val_top1"] >= accuracy), None)

    @property
    def single_view_top1(self) -> float | None:
        """Final validation top-1 without test-time augmentation (the curve's last point)."""
        return self.curve[-1]["val_top1"] if self.curve else None

    def row(self) -> dict:
        return {"label": self.label, "val top-1": self.val_top1, "val top-1 (1 view)": self.single_view_top1,
                "test top-1": self.test_top1,
                **{f"s to {level:.0%}": self.time_to(level) for level in MILESTONES},
                "seconds": self.seconds, "setup s": self.setup_seconds, "images/s": self.images_per_second,
                "epochs": len(self.curve), "precision": self.precision}


class Clock:
    """Wall-clock seconds since `start()`, excluding the spans run inside `paused()`."""

    def __init__(self):
        self.started = time.perf_counter()
        self.excluded = 0.0

    def seconds(self) -> float:
        return time.perf_counter() - self.started - self.excluded

    @contextlib.contextmanager
    def paused(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - start


def format_point(point: dict) -> str:
    """One curve point as the line `workbook speedrun` and the benchmark print (epochs are fractional:
    a budget can end an epoch early)."""
    return (f"{point['seconds']:8.1f} s  epoch {point['epoch']:5.2f}  val top-1 {point['val_top1']:.2%}  "
            f"{point['images_per_second']:.0f} images/s  data wait {point.get('data_wait_fraction', 0.0):.0%}")


def check_budget(budget_seconds: float | None) -> None:
    """None (no budget: the config's epochs) or a finite number of seconds, 0 or more (0: spent after the
    first optimizer step)."""
    import math

    if budget_seconds is not None and not (math.isfinite(budget_seconds) and budget_seconds >= 0):
        raise ConfigError(f"--budget-seconds must be a finite number of seconds, 0 or more, got {budget_seconds:g}; "
                          "leave it out to train the recipe's epochs")


def race(config: Config, *, budget_seconds: float | None = None, label: str = "", bundle=None,
         progress: bool = True, verbose: bool = True, on_epoch: Callable[[dict], None] | None = None,
         record: bool = True, every_epoch: bool = True) -> RaceResult:
    """Train `config` for its epochs, or until the clock passes `budget_seconds` (the epoch in
    progress finishes), validating after every epoch; then predict the validation (and test) split
    with the config's test-time augmentation. `on_epoch(point)` sees each curve point as it comes.
    `every_epoch=False` (no budget: a fixed-length run whose end is all that counts) validates only
    after the last epoch, so the curve has one point. A budget that is no finite number of seconds, 0 or
    more (-1, nan, inf), is a ConfigError in one line."""
    check_budget(budget_seconds)
    train.check_outputs(config)
    clock = Clock()
    state = train.prepare(config, bundle, verbose=verbose)
    setup_seconds = clock.seconds()
    curve = []
    # The budget is checked after every optimizer step (not only between epochs), so a racer whose
    # epoch is longer than the budget is stopped at the budget like the others. Under DDP every
    # rank must run the same steps, so there it is checked between epochs only.
    spent = None if budget_seconds is None or state.distributed.enabled else (
        lambda: clock.seconds() >= budget_seconds)
    for epoch in range(state.start_epoch, config.epochs):
        row = train.train_one_epoch(state, epoch, progress=progress, stop=spent)
        if not every_epoch and budget_seconds is None and epoch < config.epochs - 1:
            state.history.append(row)
            continue
        with clock.paused():  # a measurement for the curve, not part of training
            scores = train.validate(_weights(state), state)
        # A budget may end an epoch early: the curve counts epochs in fractions of the split seen.
        point = {"seconds": clock.seconds(), "epoch": epoch + row["optimizer_steps"] / state.steps_per_epoch,
                 "val_top1": scores["top1"], "val_loss": scores["loss"],
                 "train_loss": row["train_loss"], "images_per_second": row["images_per_second"],
                 "data_wait_fraction": row["data_wait_fraction"]}
        curve.append(point)
        state.history.append({**row, "val_top1": scores["top1"], "val_loss": scores["loss"]})
        if on_epoch:
            on_epoch(point)
        if budget_seconds is not None and point["seconds"] >= budget_seconds:
            done = "" if row["optimizer_steps"] == state.steps_per_epoch else \
                f" ({row['optimizer_steps']} of its {state.steps_per_epoch} steps)"
            state.log(f"budget of {budget_seconds:.0f} s spent in epoch {epoch + 1} of {config.epochs}{done}")
            break
    final = train.validate(_weights(state), state, views=config.tta_views, selective=config.tta_selective)
    test = {}
    if state.bundle.test is not None and len(state.bundle.test):
        with clock.paused():
            test_state = dataclasses.replace(state, val_loader=validation_batches(state.bundle.test, config,
                                                                                  state.distributed, state.device))
            test = train.validate(_weights(state), test_state, views=config.tta_views, selective=config.tta_selective)
    result = RaceResult(label or config.recipe or config.model, config, curve, setup_seconds, clock.seconds(),
                        final["top1"], test.get("top1"), state.precision,
                        curve[-1]["images_per_second"] if curve else 0.0, state.bundle.num_classes,
                        len(state.bundle.val) if state.bundle.val is not None else 0, final["top5"], test.get("top5"))
    if record and state.distributed.is_main:
        ledger.record("speedrun", result.label, duration_seconds=result.seconds,
                      parameters={**config.to_dict(), "budget_seconds": budget_seconds, "precision_used": state.precision},
                      metrics={k: v for k, v in result.row().items() if isinstance(v, (int, float)) and v is not None}
                      | {"curve": curve, "val_images": result.val_images})
    return result


def _weights(state):
    """The weights a race is scored on: the EMA's when the recipe keeps one, else the model's."""
    return state.ema.module if state.ema is not None else state.model


def race_seeds(config: Config, seeds: list[int], *, budget_seconds: float | None = None, label: str = "",
               on_epoch: Callable[[int, dict], None] | None = None, progress: bool = False,
               record: bool = True) -> list[RaceResult]:
    """The same race once per seed, each building its own data inside its own clock (a pre-decoded
    cache left by an earlier race is reused; `benchmarks/bench_speedrun.py` removes it first, so that
    every clock includes decoding). `on_epoch(seed, point)` sees each curve point."""
    check_budget(budget_seconds)  # before the first seed builds its data
    results = []
    for seed in seeds:
        shown = (lambda point, seed=seed: on_epoch(seed, point)) if on_epoch else None
        results.append(race(config.replace(seed=seed), budget_seconds=budget_seconds, label=label, progress=progress,
                            verbose=False, on_epoch=shown, record=record))
    return results


def seed_summary(results: list[RaceResult], level: float = 0.95, target: float = 0.97) -> dict:
    """How speed-run records are reported (airbench's means over many runs; fastai's Imagenette
    rules): over the seeds, the mean and Student-t interval of the final top-1 without test-time
    augmentation and, apart, with it; the seconds to `target` (single view, the curve) over the seeds
    that reached it, and how many did. One seed gives its values with no interval."""
    from course_lib.analysis import statistics

    def interval(values: list[float], bounds: tuple[float, float]) -> dict | None:
        if not values:
            return None
        if len(values) == 1:
            return {"mean": values[0], "low": None, "high": None, "std": None, "runs": 1}
        found = statistics.confidence_interval(values, level)
        # A t interval knows nothing of bounds: an accuracy cannot pass 100%, nor a time go below 0.
        return {**found, "low": max(found["low"], bounds[0]), "high": min(found["high"], bounds[1])}

    accuracy, positive = (0.0, 1.0), (0.0, float("inf"))
    reached = [r.time_to(target) for r in results if r.time_to(target) is not None]
    tta_views = results[0].config.tta_views
    summary = {"seeds": [r.config.seed for r in results], "runs": len(results), "level": level, "target": target,
               "split": "val", "tta_views": tta_views,
               "top1": interval([r.single_view_top1 for r in results], accuracy),
               "top1_tta": interval([r.val_top1 for r in results], accuracy) if tta_views > 1 else None,
               "seconds": interval([r.seconds for r in results], positive),
               "seconds_to_target": interval(reached, positive), "reached_target": len(reached),
               "images_per_second": interval([r.images_per_second for r in results], positive)}
    tests = [r.test_top1 for r in results if r.test_top1 is not None]
    summary["test_top1_tta" if tta_views > 1 else "test_top1"] = interval(tests, accuracy)
    # top-5 (ImageNet's second figure), with the config's views; absent from races made before it was kept
    for key, values in (("top5", [r.val_top5 for r in results]), ("test_top5", [r.test_top5 for r in results])):
        summary[key] = interval([v for v in values if v is not None], accuracy)
    return summary


def format_interval(values: dict | None, percent: bool = True) -> str:
    """`97.12% [96.80%, 97.44%]` (or seconds with one decimal); one run: its value alone."""
    if values is None:
        return "-"
    shown = (lambda v: f"{v:.2%}") if percent else (lambda v: f"{v:.1f}")
    if values.get("low") is None:
        return f"{shown(values['mean'])} (1 run)"
    return f"{shown(values['mean'])} [{shown(values['low'])}, {shown(values['high'])}]"


def summary_lines(summary: dict) -> list[str]:
    """The seed summary as the lines `workbook speedrun --seeds N` and the benchmark print."""
    views = summary["tta_views"]
    rows = [("final top-1, 1 view", format_interval(summary["top1"]))]
    if summary.get("top1_tta"):
        rows.append((f"final top-1, {views} views (TTA)", format_interval(summary["top1_tta"])))
    shown_views = f"{views} views" if views > 1 else "1 view"
    for key, name in (("top5", f"final top-5, {shown_views}"), ("test_top1", "test split top-1, 1 view"),
                      ("test_top1_tta", f"test split top-1, {views} views"),
                      ("test_top5", f"test split top-5, {shown_views}")):
        if summary.get(key):
            rows.append((name, format_interval(summary[key])))
    to_target = (f"{format_interval(summary['seconds_to_target'], percent=False)} s, reached by "
                 f"{summary['reached_target']} of {summary['runs']}" if summary["seconds_to_target"]
                 else f"not reached by any of {summary['runs']}")
    rows += [(f"seconds to {summary['target'] * 100:g}% (1 view)", to_target),  # 97%, 87.43%
             ("seconds in all", f"{format_interval(summary['seconds'], percent=False)} s")]
    width = max(len(name) for name, _ in rows)
    return [f"over {summary['runs']} seed(s) {summary['seeds']}: mean [{summary['level']:.0%} t interval], "
            f"on the {summary['split']} split"] + [f"  {name:<{width}}  {value}" for name, value in rows]
