"""Reproduce the usual CNN-training failures small and safe, and check a setup before a long run (notebook 11).

`preflight(config)` is the article's habit of running 5-10 steps on a tiny subset before the real job: the same
small batch every step, whose loss must fall (Karpathy's "overfit one batch",
https://karpathy.github.io/2019/04/25/recipe/), with memory, speed and any error as one line. The other helpers
make each failure happen on purpose (a slow dataset, wrong normalization, broken images, an untrusted checkpoint,
data-dependent control flow for `torch.compile`, a sampler without `set_epoch`) so the notebook can show the
signal that gives it away and the fix.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler, Subset

from course_lib import paths
from course_lib.analysis import claims as claim
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import Config, ConfigError, WorkbookError, resolve_profile
from course_lib.data import datasets, pipeline, transforms
from course_lib.data.datasets import config_with_data
from course_lib.engine import train
from course_lib.engine.precision import grad_scaler
from course_lib.engine.step import optimizer_step, training_step
from course_lib.instruments import peak_memory
from course_lib.instruments.timing import stopwatch, time_repeats


@dataclasses.dataclass
class PreflightReport:
    ok: bool  # every step ran and the loss fell
    steps: int  # optimizer steps that ran
    losses: list[float]  # training loss per step
    loss_decreased: bool  # mean of the last two steps below the first step's loss
    images_per_second: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str | None  # cuda_max_allocated | process_peak_rss
    data_wait_fraction: float | None
    seconds: float  # wall time of the whole check
    error: str | None = None  # "ErrorType: message" when a step failed
    problems: list[str] = dataclasses.field(default_factory=list)  # one line each, with the fix

    def summary(self) -> dict:
        """One row for a table."""
        first, last = (self.losses[0], self.losses[-1]) if self.losses else (None, None)
        return {"ok": self.ok, "steps": self.steps, "first loss": first, "last loss": last,
                "loss decreased": self.loss_decreased, "images/s": self.images_per_second,
                "peak memory MiB": self.peak_memory_bytes / 2**20 if self.peak_memory_bytes else None,
                "data wait": self.data_wait_fraction, "seconds": self.seconds,
                "problems": "; ".join(self.problems) or "none"}


def tiny_bundle(config: Config, images: int, bundle=None):
    """The config's datasets cut to `images` training images taken round-robin over the classes (so every class
    is present), and no validation split."""
    bundle = bundle or pipeline.build_datasets(config)
    by_class: dict[int, list[int]] = {}
    for index, target in enumerate(_targets(bundle.train)):
        by_class.setdefault(int(target), []).append(index)
    rounds = itertools.zip_longest(*by_class.values())  # the first image of every class, then the second ...
    chosen = [index for round_ in rounds for index in round_ if index is not None][:images]
    return datasets.DataBundle(Subset(bundle.train, chosen), None, None, list(bundle.classes),
                               f"{bundle.source} (first {len(chosen)} training images)")


def _targets(dataset) -> list[int]:
    if getattr(dataset, "targets", None) is not None:
        return list(dataset.targets)
    if getattr(dataset, "indices", None) is not None and getattr(dataset, "dataset", None) is not None:
        parent = _targets(dataset.dataset)  # a Subset of a dataset with targets
        return [parent[i] for i in dataset.indices]
    return [int(dataset[i][1]) for i in range(len(dataset))]


def preflight(config: Config, steps: int = 5, *, bundle=None, output_dir: str | None = None) -> PreflightReport:
    """Train `steps` optimizer steps on the same batch of `config.batch_size` images (an epoch of one step each),
    every speed switch of `config` on: the loss must fall, and an error comes back as one line, not a traceback."""
    if steps < 2:
        raise ConfigError(f"preflight needs at least 2 steps to see the loss move, got steps={steps}")
    started = time.perf_counter()
    # Warmup off and a flat schedule: the few steps must use the real learning rate.
    check = config.replace(epochs=steps, max_steps=1, max_train_images=0, resume=False, checkpoint="",
                           warmup_epochs=0.0, min_lr=config.lr,
                           output_dir=output_dir or tempfile.mkdtemp(prefix="preflight-"))
    try:
        small = tiny_bundle(check, check.batch_size * check.accumulation_steps, bundle)
        # Each pre-flight step is a one-step epoch: the engine's bar reads `epoch k/steps`.
        result = train.fit(check, bundle=small, progress=True, verbose=False)
    except (WorkbookError, FileNotFoundError, RuntimeError, MemoryError, ValueError) as error:
        kind = "out of memory" if peak_memory.is_out_of_memory(error) else type(error).__name__
        message = str(error).strip().splitlines()[0] if str(error).strip() else kind
        # Each pre-flight step is an epoch of one step: name the step the user asked for.
        message = re.sub(r"at epoch (\d+), step 1\b", r"at pre-flight step \1", message)
        fix = {"out of memory": "lower batch_size, use precision=auto or accumulation_steps>1"}.get(kind)
        return PreflightReport(False, 0, [], False, None, None, None, None, time.perf_counter() - started,
                               error=f"{kind}: {message}", problems=[fix or message])
    finally:
        if output_dir is None:
            shutil.rmtree(check.output_dir, ignore_errors=True)
    losses = [row["loss"] for row in result.step_log]
    decreased = len(losses) >= 2 and statistics.fmean(losses[-2:]) < losses[0]
    history = result.history
    problems = []
    if not decreased:
        problems.append(f"the loss did not fall on a repeated batch ({losses[0]:.3f} -> {losses[-1]:.3f}): "
                        "check labels, the learning rate (try 10x lower or higher) and input normalization")
    later = history[1:] or history  # the first step pays for first-call allocations and worker start-up
    wait = statistics.fmean(row["data_wait_fraction"] for row in later)
    if wait > 0.5:
        problems.append(f"{wait:.0%} of each step waits for data: raise num_workers")
    return PreflightReport(ok=not problems, steps=len(losses), losses=losses, loss_decreased=decreased,
                           images_per_second=statistics.median(row["images_per_second"] for row in later),
                           peak_memory_bytes=int(max(row["peak_memory_bytes"] for row in history)),
                           peak_memory_kind=history[-1]["peak_memory_kind"], data_wait_fraction=wait,
                           seconds=time.perf_counter() - started, problems=problems)


def error_message(function, *args, **kwargs) -> str | None:
    """"ErrorType: message" of the error `function(*args, **kwargs)` raises, or None when it succeeds: lets a
    notebook show a failure without stopping."""
    try:
        function(*args, **kwargs)
    except Exception as error:  # the lesson is the message, whatever the type
        text = str(error).strip()
        return f"{type(error).__name__}: {text}" if text else type(error).__name__
    return None


class SlowDataset(torch.utils.data.Dataset):
    """Wraps a dataset and sleeps `delay_seconds` per image: slow storage or heavy decoding,
    reproduced without using a core (sleeping workers overlap even on a 2-core machine)."""

    def __init__(self, dataset, delay_seconds: float):
        self.dataset, self.delay_seconds = dataset, delay_seconds
        self.classes = getattr(dataset, "classes", None)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        time.sleep(self.delay_seconds)
        return self.dataset[index]


class Renormalized(torch.utils.data.Dataset):
    """A dataset of normalized images fed through a wrong input pipeline: "raw" gives 0-255 pixel values (the
    transform forgot to scale and normalize), "unit" gives 0-1 values without Normalize."""

    KINDS = ("raw", "unit")

    def __init__(self, dataset, kind: str = "raw"):
        if kind not in self.KINDS:
            raise ConfigError(f"kind={kind!r} is not one of {', '.join(self.KINDS)}")
        self.dataset, self.kind = dataset, kind
        self.classes = getattr(dataset, "classes", None)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        image, target = self.dataset[index]
        pixels = transforms.denormalize(image)  # back to 0-1
        return (pixels * 255.0 if self.kind == "raw" else pixels), target


def wrong_normalization_bundle(bundle, kind: str = "raw", splits=("train", "val")):
    """A copy of `bundle` whose `splits` use the wrong input pipeline `kind` (see Renormalized)."""
    changed = {split: Renormalized(getattr(bundle, split), kind) if split in splits and getattr(bundle, split)
               is not None else getattr(bundle, split) for split in ("train", "val", "test")}
    return datasets.DataBundle(changed["train"], changed["val"], changed["test"], list(bundle.classes),
                               f"{bundle.source} ({kind} inputs in {', '.join(splits)})")


def input_statistics(dataset, images: int = 64) -> dict:
    """Mean, standard deviation, min and max over the first `images` inputs: after Normalize
    they should be near 0 and 1; hundreds mean unnormalized pixels."""
    count = min(images, len(dataset))
    batch = torch.stack([dataset[i][0] for i in range(count)]).float()
    return {"images": count, "mean": batch.mean().item(), "std": batch.std().item(),
            "min": batch.min().item(), "max": batch.max().item()}


def normalization_verdict(statistics_row: dict, tolerance: float = 3.0) -> str:
    """A one-line reading of `input_statistics`."""
    mean, std = statistics_row["mean"], statistics_row["std"]
    if abs(mean) < tolerance and 1 / tolerance < std < tolerance:
        return "normalized (mean near 0, std near 1)"
    if statistics_row["max"] > 10.0:  # normalized images stay within a few units of 0
        return "unnormalized 0-255 pixels: scale to 0-1 (ToDtype(scale=True)) and Normalize(mean, std)"
    return f"not normalized (mean {mean:.2f}, std {std:.2f}): apply Normalize with the dataset's mean and std"


def make_broken_folder(out_dir, source=None, per_class: int = 3, classes: int = 2) -> dict:
    """Copy `per_class` images of the first `classes` classes of an ImageFolder (default: the committed
    landcover-synth train split) to out_dir and break three: truncated, empty, text named .jpg."""
    source = Path(source) if source else paths.resolve_path(str(paths.SAMPLE_DIR / "train"))
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    names = sorted(p.name for p in source.iterdir() if p.is_dir())[:classes]
    if not names:
        raise FileNotFoundError(f"no class folders in {source}")
    for name in names:
        (out_dir / name).mkdir(parents=True)
        for path in sorted((source / name).iterdir())[:per_class]:
            shutil.copy(path, out_dir / name / path.name)
    first = out_dir / names[0]
    truncated, empty = sorted(first.iterdir())[:2]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 3])
    empty.write_bytes(b"")
    text = first / "notes.jpg"
    text.write_text("this is not an image\n")
    return {"folder": out_dir, "broken": [truncated, empty, text]}


class NotAWeight:
    """A harmless object that is not a tensor: pickled, it stands for any code a checkpoint from an unknown
    source could carry."""

    def __init__(self, note: str = "arbitrary object"):
        self.note = note


def write_untrusted_checkpoint(path) -> Path:
    """A checkpoint with a pickled custom object next to the weights (as torch.save of a whole model writes):
    `torch.load(weights_only=True)` refuses it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"weight": torch.zeros(2)}, "extra": NotAWeight()}, path)
    return path


def write_truncated_checkpoint(good_path, path) -> Path:
    """The first half of a real checkpoint: what a crash during a non-atomic save leaves."""
    payload = Path(good_path).read_bytes()
    Path(path).write_bytes(payload[: len(payload) // 2])
    return Path(path)


class BranchyNet(torch.nn.Module):
    """A small CNN whose forward has a Python `if` on a tensor value (`dynamic=True`): dynamo breaks the graph
    there. `dynamic=False` computes the same with `torch.where`, in one graph."""

    def __init__(self, num_classes: int = 8, dynamic: bool = True):
        super().__init__()
        self.dynamic = dynamic
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.head = torch.nn.Linear(32, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.conv1(images)
        if self.dynamic:  # note: reads a tensor value in Python: a graph break (and a sync on GPU)
            features = features.relu() if features.mean() > 0 else features.abs()
        else:
            features = torch.where(features.mean() > 0, features.relu(), features.abs())
        return self.head(self.conv2(features).relu().mean(dim=(2, 3)))


def graph_breaks(model: torch.nn.Module, example: torch.Tensor) -> dict:
    """How dynamo splits `model(example)`: graphs, graph breaks and their reasons
    (torch._dynamo.explain: tracing only, no code generation, so it is fast)."""
    torch._dynamo.reset()  # torch imports dynamo on first use: seconds that importing this module need not pay
    explanation = torch._dynamo.explain(model)(example)
    reasons = [str(getattr(reason, "reason", reason)).splitlines()[0][:120] for reason in explanation.break_reasons]
    return {"graphs": explanation.graph_count, "graph_breaks": explanation.graph_break_count, "reasons": reasons}


def compile_timing(model: torch.nn.Module, example: torch.Tensor, repeats: int = 5) -> dict:
    """Seconds of the first compiled forward+backward (the article's "slow first compile": minutes on a CPU for
    a real model) and the median of later calls, against eager."""
    device = example.device

    def step(module):
        return lambda: module(example).float().sum().backward()

    eager = time_repeats(step(model), repeats=repeats, warmup=1, device=device).median
    torch._dynamo.reset()
    compiled = torch.compile(model)
    first, _ = stopwatch(step(compiled), device)  # the first call traces and generates code: timed once
    later = time_repeats(step(compiled), repeats=repeats, warmup=0, device=device).median
    return {"eager_seconds": eager, "first_compiled_seconds": first, "compiled_seconds": later,
            "compile_overhead_seconds": first - later, "speedup": eager / later if later else math.nan,
            "calls_to_repay": (first - later) / (eager - later) if eager > later else math.inf}


def epoch_orders(count: int, world_size: int = 2, epochs: int = 3, *, call_set_epoch: bool = True,
                 rank: int = 0, seed: int = 0, show: int = 8) -> list[list[int]]:
    """The first `show` indices rank `rank` of a DistributedSampler yields in each epoch, with or without
    `sampler.set_epoch(epoch)`."""
    sampler = DistributedSampler(range(count), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    orders = []
    for epoch in range(epochs):
        if call_set_epoch:
            sampler.set_epoch(epoch)
        orders.append(list(sampler)[:show])
    return orders


def plain_sgd_losses(dataset, lr: float = 0.05, steps: int = 15, batch_size: int = 32, seed: int = 0,
                     num_classes: int = 8) -> list[float]:
    """Training losses of the BatchNorm-free `BranchyNet` under SGD with momentum: with no normalization layer,
    the scale of the inputs reaches the gradients directly, which is what makes unnormalized inputs blow up."""
    torch.manual_seed(seed)
    model = BranchyNet(num_classes, dynamic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scaler = grad_scaler("off", "cpu")  # the engine's step in plain fp32
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(seed))
    losses = []
    for images, targets in itertools.islice(itertools.cycle(loader), steps):
        loss, _ = training_step(model, images, targets, F.cross_entropy, scaler)
        optimizer_step(optimizer, scaler)
        losses.append(loss.item())
    return losses


def claims(breaks, compile_rows, compile_signal: str, reports: dict, orders, simulated: list, starve_table,
           slow_read_ms: float, container: dict | None = None) -> list:
    """Notebook 11's claims, each decided by what it reproduced: graph breaks and compile times per variant
    (`compile_rows` None: not measured), pre-flight reports ("this configuration" first), epoch orders, the doctor's
    problems on a made-up machine, data wait per num_workers and, when given, the container-runtime diagnoses."""
    python_if, static = breaks.loc["python if"], breaks.loc["torch.where"]
    first = None if compile_rows is None else float(compile_rows.loc["torch.where", "first_compiled_seconds"])
    good, broken = next(iter(reports.values())), list(reports.values())[1:]
    caught = sum(not report.ok for report in broken)
    without, with_call = list(orders["without set_epoch"]), list(orders["with set_epoch"])
    waits = list(starve_table["data wait"])
    found = [
        claim.checked("compile_static_control_flow", python_if["graph_breaks"] > 0 and static["graph_breaks"] == 0,
                      f"Python if: {int(python_if['graphs'])} graphs, {int(python_if['graph_breaks'])} break(s); "
                      f"torch.where: {int(static['graphs'])} graph, {int(static['graph_breaks'])} breaks",
                      value=float(python_if["graph_breaks"])),
        claim.not_measurable("compile_first_call_slow", compile_signal) if first is None else claim.checked(
            "compile_first_call_slow", first >= 10, compile_signal + " (a tiny BranchyNet: a real CNN takes longer)",
            value=first),
        claim.checked("preflight_catches_errors", caught == len(broken),
                      f"{good.steps} steps in {good.seconds:.1f} s; caught {caught} of {len(broken)} broken setups "
                      f"({', '.join(list(reports)[1:])})", value=caught),
        claim.checked("set_epoch_reshuffles", len(set(without)) == 1 and len(set(with_call)) == len(with_call),
                      f"{len(without) - len(set(without)) + 1} of {len(without)} epochs shared one order without it; "
                      f"{len(set(with_call))} different orders with it"),
        # The doctor's rule on a made-up mismatch: shown, not measured on a real driver.
        claim.demonstrated("driver_matches_cuda", bool(simulated),
                           (simulated[0]["advice"] if simulated else "no problem found")
                           + " (the doctor's rule applied to a made-up CUDA 12.4 wheel on driver 470)"),
        claim.checked("workers0_starves", waits[0] >= 0.5 and waits[-1] < waits[0],
                      f"data wait {waits[0]:.0%} at num_workers=0 -> {waits[-1]:.0%} with "
                      f"{starve_table.index[-1].split('=')[-1]} workers ({slow_read_ms:g} ms simulated storage per "
                      "image)", value=waits[0])]
    if container is not None:  # the rule on made-up machines: shown, not measured on a broken one
        right = [name for name, causes in container.items() if causes == [name]]
        found.append(claim.demonstrated(
            "container_gpu_access", len(right) == len(container) > 0,
            f"the container-runtime rule names the one cause of {len(right)} of {len(container)} made-up broken "
            f"machines ({', '.join(container)})"))
    return found


# Per profile: steps of every run, and steps of section 2's hand-written loop.
SIZES = {"smoke": {"max_steps": 4, "plain_steps": 8}, "cpu": {"max_steps": 12, "plain_steps": 30},
         "gpu": {"max_steps": 12, "plain_steps": 30}}


@dataclasses.dataclass(kw_only=True)
class TroubleshootSetup(ChapterSetup):
    """Notebook 11's config, data, datasets and scratch folder (`setup`)."""

    scratch: Path  # broken files go here; the notebook's last cell removes it
    plain_steps: int  # steps of the hand-written loop of section 2 (smoke 8)

    def line(self) -> str:
        config = self.config
        return (f"{config.model} at {config.image_size} px, batch {config.batch_size}, {config.max_steps} steps per "
                f"run, device {self.device}\nhardware: {self.hardware}")


def setup(profile: str, *, max_steps: int | None = None, **given) -> TroubleshootSetup:
    """The profile's own data (`find_real=False`: the problems are made, not found), one epoch of `max_steps`
    steps (None: the profile's `SIZES`)."""
    chosen = sizes(SIZES, profile)
    config, data = config_with_data(profile, find_real=False, epochs=1, max_steps=max_steps or chosen["max_steps"],
                                    output_dir="runs/checkpoints/11_troubleshooting",
                                    **{k: v for k, v in given.items() if v is not None})
    # The problems are made in the per-image transforms (normalisation above all): the gpu profile's
    # augmentation=device would hand the lessons uint8 images.
    config = config.replace(augmentation="cpu")
    return TroubleshootSetup(profile=resolve_profile(profile), data=data, config=config,
                             bundle=pipeline.build_datasets(config), plain_steps=chosen["plain_steps"],
                             scratch=Path(tempfile.mkdtemp(prefix="troubleshooting-")))
