"""Notebook 05's claims and advice: the articles' DDP rules of thumb (85% scaling efficiency at 4
GPUs, act when communication passes 15% of a step, stage 3's 2.5x) applied to what `engine.ddp`
measured, as `analysis.claims` records and as advice lines (`workbook ddp --scaling` prints them);
and the notebook's config, data and sizes per profile (`setup`)."""
from __future__ import annotations

import dataclasses
import statistics as stats

import pandas as pd

from course_lib.analysis import claims as claim
from course_lib.analysis import statistics
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import resolve_profile
from course_lib.data.datasets import config_with_data
from course_lib.data import pipeline
from course_lib.devices import physical_cores
from course_lib.engine import torchrun
from course_lib.engine.allreduce import human_bytes
from course_lib.engine.ddp import ScalingReport, efficiency_interval
from course_lib.measure import flops, topology
from course_lib.models.factory import build_model

# The articles' rules of thumb.
EFFICIENCY_TARGET = 0.85  # "4-GPU DDP should reach 85% scaling efficiency or better"
COMMUNICATION_LIMIT = 0.15  # "when communication is more than 15% of the step, act"
ARTICLE_STAGE3_SPEEDUP = 2.5  # "4 GPUs: about 2.5x over single-GPU AMP" (13 min -> ~5 min per epoch)
ARTICLE_EXAMPLE_MINUTES = (100.0, 35.0)  # 1 GPU 100 min, 4 GPUs 35 min: "71%, low"

# Values over the profile. On a CPU every launch pays process start-up, and the lesson is in the
# ratios: smaller runs keep the cpu profile near 2 minutes (a GPU keeps its profile's sizes).
DDP_PROFILES = {"cpu": {"image_size": 32, "max_steps": 8, "max_train_images": 512}}
OUTPUT_DIR = "runs/checkpoints/ddp"
# The scaling probe per profile: timed steps per setting, thrown-away warm-up steps, profiled steps
# (torch.profiler's all-reduce share); smoke: a check, not a measurement. The engine sweep (one
# launch per worker count) is off in smoke.
# The all-reduce sweep (`engine.allreduce`): its largest message and the timed repeats per size (smoke: 64 KiB,
# a check of the launch; cpu: 1 KiB to 256 MiB, about 20 s on 2 cores).
# spawn_compare: the probe again under mp.spawn (off in smoke: another launch, tested in tests/test_spawn_launch.py).
_MEASURED = {"probe_steps": 5, "warmup_steps": 2, "profile_steps": 3, "engine_sweep": True,
             "allreduce_max_bytes": 256 * 2 ** 20, "spawn_compare": True}
PROBE_CHOICES = {"smoke": {"probe_steps": 2, "warmup_steps": 1, "profile_steps": 2, "engine_sweep": False,
                           "allreduce_max_bytes": 64 * 1024, "allreduce_repeats": 3, "spawn_compare": False},
                 "cpu": {**_MEASURED, "allreduce_repeats": 12}, "gpu": {**_MEASURED, "allreduce_repeats": 20}}
# The NCCL variables the article names (A1 §1.2 and §4.4): what each changes, and the setting the notebook sweeps
# against the default where NCCL runs (None: a setting between nodes, which one node cannot show).
NCCL_SETTINGS = {
    "NCCL_P2P_LEVEL": ("the farthest path between two GPUs over which NCCL still copies peer to peer (LOC: never; "
                       "NVL: NVLink only; PIX, PXB, PHB, SYS: through ever more of PCIe and the CPUs); beyond it the "
                       "data goes through host memory", {"NCCL_P2P_LEVEL": "LOC"}),
    "NCCL_BUFFSIZE": ("bytes of each channel's buffer between two ranks (default 4 MiB): a larger buffer can keep a "
                      "slow link busy on large messages, at the cost of GPU memory", {"NCCL_BUFFSIZE": str(16 * 2 ** 20)}),
    "NCCL_IB_DISABLE": ("1: no InfiniBand or RoCE between nodes, TCP sockets instead (NCCL_SOCKET_IFNAME picks the "
                        "interface); inside one node NCCL uses NVLink, PCIe or shared memory either way", None),
}


@dataclasses.dataclass(kw_only=True)
class DdpSetup(ChapterSetup):
    """Notebook 05's config (every worker trains with it), data and sizes; the workers are launched with its profile."""

    workers: int  # DDP worker processes of the launches and the scaling probe
    threads_per_process: int  # OMP threads per worker process
    train_images: int  # images in the training split: the sampler's shards and the probe's epoch
    flops_per_image: float  # training FLOPs (forward + backward) per image of the model: the MFU columns
    probe_steps: int  # timed steps per setting in the scaling probe
    warmup_steps: int  # thrown-away steps before the timed ones
    profile_steps: int  # steps under torch.profiler for the all-reduce share
    engine_sweep: bool  # train once per worker count through the engine
    allreduce_max_bytes: int  # the all-reduce sweep's largest message
    allreduce_repeats: int  # timed all-reduces per message size
    spawn_compare: bool  # run the probe again under mp.spawn

    def with_mfu(self, table, device, precision: str):
        """`table` with an MFU column: images_per_second x training FLOPs per image over the device's peak."""
        return flops.with_mfu(table, None, self.config.image_size, device, precision, "images_per_second",
                              flops_per_image=self.flops_per_image)

    def line(self) -> str:
        config = self.config
        return (f"profile {self.profile}: {config.model} at {config.image_size} px, {config.batch_size} images per "
                f"worker, {self.workers} worker(s) on {config.device}, {self.threads_per_process} thread(s) each\n"
                f"machine: {self.hardware}")


def setup(profile: str, *, workers: int = 0, threads_per_process: int = 1, probe_steps: int = 0,
          engine_sweep: str | bool = "auto", **params) -> DdpSetup:
    """The profile's own data (`find_real=False`), `DDP_PROFILES` over the profile, then `params`; `workers` 0: every
    GPU, or 2 on a CPU; `probe_steps` 0 and `engine_sweep` "auto": the profile's (`PROBE_CHOICES`)."""
    config, data = config_with_data(profile, DDP_PROFILES, find_real=False, **{"output_dir": OUTPUT_DIR, **params})
    choices = {**sizes(PROBE_CHOICES, profile), **({"probe_steps": probe_steps} if probe_steps else {}),
               **({} if engine_sweep == "auto" else {"engine_sweep": bool(engine_sweep)})}
    flops_per_image = flops.training_flops_per_image(build_model(config, num_classes=8), config.image_size)
    return DdpSetup(profile=resolve_profile(profile), data=data, config=config,
                    workers=workers or torchrun.default_workers(config), threads_per_process=threads_per_process,
                    train_images=len(pipeline.build_datasets(config).train), flops_per_image=flops_per_image, **choices)


def communication_verdict(share: float) -> str:
    return "act: communication above 15%" if share > COMMUNICATION_LIMIT else "fine: 15% or less"


def scaling_advice(report: ScalingReport, *, cores: int | None = None, threads_per_process: int = 1) -> list[str]:
    """The articles' rules applied to the measured numbers, and what follows from them."""
    table, communication = report.table, report.communication
    workers = int(table["workers"].max())
    strong, weak = report.efficiency("strong"), report.efficiency("weak")
    advice = []
    where = "at 4 GPUs" if workers == 4 else f"at {workers} workers (the articles' figure is for 4 GPUs)"
    verdict = "meets" if strong >= EFFICIENCY_TARGET else "misses"
    advice.append(f"Strong-scaling efficiency {strong:.0%} {where} {verdict} the >= 85% rule; "
                  f"weak scaling (same per-worker batch) reaches {weak:.0%}.")
    if weak > strong + 0.05:
        advice.append("Weak scaling beats strong scaling: each worker's share of a fixed global batch is too small "
                      "to hide the all-reduce. Keep the per-worker batch large (raise the global batch with "
                      "the worker count, scaling the learning rate).")
    share = communication.get("profiled_share")
    if share is not None:
        exposed = communication.get("exposed_share", 0.0)
        advice.append(f"All-reduce share of a step: {share:.0%} inside all-reduce events by torch.profiler (the "
                      f"articles' measure; it counts time overlapped with backward) and {exposed:.0%} exposed (what "
                      f"skipping the all-reduce under no_sync saves, including DDP's bucket copies and, on CPU, gloo's "
                      f"threads competing for the cores). Rule on the exposed share: {communication_verdict(exposed)}.")
        if share > COMMUNICATION_LIMIT >= exposed:
            advice.append("The profiler alone would say act, but DDP hides most of the all-reduce behind backward: "
                          "look at the exposed share before changing anything.")
        if exposed > COMMUNICATION_LIMIT:
            advice.append("Communicate less often or less: gradient accumulation (accumulation_steps=k) all-reduces "
                          "once per k micro-batches because the engine runs the others under DDP's no_sync(); a larger "
                          "per-worker batch gives backward more computation to hide the all-reduce behind.")
            if report.device.startswith("cuda"):
                advice.append("On GPUs: check `nvidia-smi topo -m`; over PCIe rather than NVLink try NCCL_P2P_LEVEL "
                              "(e.g. NVL or PIX) and compare; multi-node: NCCL_IB_DISABLE=0 on InfiniBand, tune "
                              "NCCL_BUFFSIZE; a larger DDP bucket_cap_mb or an fp16 compression comm hook.")
    if report.device == "cpu":
        cores = cores or physical_cores()
        if workers * threads_per_process > cores:
            advice.append(f"{workers} processes x {threads_per_process} thread(s) oversubscribe this machine's {cores} "
                          "cores: the workers compete for the same cores, so no scaling is possible here.")
        if report.load_average is not None and report.load_average > max(cores, workers) + 0.5:
            advice.append(f"The 1-minute load average was {report.load_average:.1f} on {cores} cores: other processes "
                          "competed with the workers, so these times are noisy; rerun on an idle machine.")
        advice.append(f"On CPU, DDP adds workers but not cores: {workers} workers with {threads_per_process} "
                      f"thread(s) each on {cores} cores, gradients all-reduced by gloo over loopback TCP. "
                      "Efficiency here says little about GPUs with NCCL; rerun with profile=gpu.")
    return advice


def claims(report: ScalingReport, equivalence: dict | None = None) -> list:
    """The articles' DDP claims: the 85% rule (measured only on 4 or more CUDA GPUs), the article's 71% example,
    the 15% communication rule, stage 3's 2.5x and, when given, the 1-worker equivalence check."""
    workers = int(report.table["workers"].max())
    strong = report.table[report.table["mode"] == "strong"].sort_values("workers").iloc[-1]
    interval = efficiency_interval(report) or {"efficiency": float(strong["efficiency"]), "low": None, "high": None}
    efficiency, low, high = interval["efficiency"], interval["low"], interval["high"]
    measured_here = (f"{efficiency:.0%} strong-scaling efficiency at {workers} worker(s) on {report.device} "
                     f"({report.precision})" + (f", 95% interval [{low:.0%}, {high:.0%}] over repeated steps"
                                                if low is not None else ""))
    caveat = (" (processes sharing the same cores, gradients through gloo: a lower bound that says little "
              "about NCCL on GPUs)" if report.device == "cpu" else "")
    single, four = ARTICLE_EXAMPLE_MINUTES
    single_worker_seconds = report.table.query("mode == 'strong' and workers == 1")["epoch_seconds"].iloc[0]
    stage3 = (f"{strong['speedup']:.2f}x with {workers} worker(s) at the same global batch; 2.5x on 4 GPUs is "
              f"{ARTICLE_STAGE3_SPEEDUP / 4:.1%} efficiency, below the articles' own 85% bar")
    gpus = report.device.startswith("cuda") and workers >= 4
    rows = [
        claim.measured("ddp_efficiency", 100 * efficiency, (100 * low, 100 * high) if low is not None else None,
                       reason=f"{measured_here}; T1 / (N x TN) at the same global batch") if gpus else
        claim.not_measurable("ddp_efficiency", f"needs 4 or more CUDA GPUs; measured instead: {measured_here}{caveat}"),
        # The article's own arithmetic, redone: shown, not measured.
        claim.demonstrated("ddp_article_example", single / (4 * four) < EFFICIENCY_TARGET,
                           f"T1 / (N x TN) = {single:g} / (4 x {four:g}) = {single / (4 * four):.1%}, below the 85% "
                           f"bar; the same formula here: T1 {single_worker_seconds:.2f} s, T{workers} "
                           f"{strong['epoch_seconds']:.2f} s per epoch"),
        communication_claim(report, efficiency),
        claim.checked("ddp_stage3_speedup", strong["speedup"] >= 0.75 * ARTICLE_STAGE3_SPEEDUP, stage3) if gpus
        else claim.not_measurable("ddp_stage3_speedup", f"needs 4 CUDA GPUs; measured instead: {stage3}")]
    if equivalence is not None:
        rows.append(claim.checked(
            "ddp_equivalence", bool(equivalence["equal"]),
            reason=f"max |weight difference| after {equivalence['steps']} steps: "
                   f"{equivalence['max_abs_difference']:.1e} ({equivalence['world_size']} workers, "
                   f"{equivalence['nnodes']} node(s)), tolerance {equivalence['tolerance']:g}"))
    return rows


def communication_claim(report: ScalingReport, efficiency: float):
    """The 15% rule: on GPUs, whether the exposed all-reduce share predicted the efficiency it protects."""
    share = report.communication.get("profiled_share")
    if share is None:
        return claim.not_measurable("ddp_communication_share", "one worker: nothing to communicate")
    exposed = report.communication.get("exposed_share", 0.0)
    found = (f"profiled {share:.0%} of a step inside all-reduce events (includes overlap with backward), "
             f"exposed {exposed:.0%} (no_sync): {communication_verdict(exposed)}; efficiency {efficiency:.0%}")
    if not report.device.startswith("cuda"):  # workers sharing cores miss 85% whatever communication takes
        return claim.not_measurable("ddp_communication_share",
                                    f"needs GPUs, each worker on its own device; measured: {found}")
    # More than 15% exposed goes with a missed 85%, and at most 15% with 85% met: either mismatch refutes it.
    return claim.checked("ddp_communication_share", (exposed > COMMUNICATION_LIMIT) == (efficiency < EFFICIENCY_TARGET),
                         found + " (holds when more than 15% exposed goes with under 85% efficiency, and the reverse)")


def nccl_settings(default, measure) -> tuple[object, dict]:
    """(table, reports): per NCCL variable the article names, what it changes, the setting tried and the peak bus
    bandwidth with it (`measure(env)` sweeps again) against the default sweep; `reports`: the sweeps measured."""
    rows, reports = [], {}
    for name, (changes, setting) in NCCL_SETTINGS.items():
        row = {"variable": name, "what it changes": changes,
               "setting tried": ", ".join(f"{k}={v}" for k, v in (setting or {}).items()) or "-"}
        if default.backend != "nccl":
            row["peak bus GB/s (default)"] = f"not measurable here: {default.backend} on {default.device}, no NCCL"
        elif setting is None:
            row["peak bus GB/s (default)"] = "not measurable on one node"
        else:
            reports[name] = measure(setting)
            row["peak bus GB/s (default)"] = f"{reports[name].peak:.1f} ({default.peak:.1f})"
        rows.append(row)
    return pd.DataFrame(rows), reports


def nvlink_claim(default, without_p2p=None, worst_link: str | None = None):
    """The article's "PCIe instead of NVLink: several times less bandwidth" (A1 §1.2) where NCCL ran between GPUs
    NVLink joins (`worst_link`): the largest message with peer-to-peer copies against `without_p2p` (P2P_LEVEL=LOC)."""
    if default.backend != "nccl" or without_p2p is None:
        return claim.not_measurable("allreduce_nvlink_vs_pcie", "needs 2 GPUs joined by NVLink, with NCCL; measured "
                                    f"instead: {default.line()}")
    if worst_link != "NV":
        joined = worst_link or "an unknown link"
        return claim.not_measurable("allreduce_nvlink_vs_pcie", f"the GPUs here are joined by {joined}, not NVLink: "
                                    "nothing to compare PCIe against")
    size = int(default.table["bytes"].max())
    ratio = statistics.ratio_interval(without_p2p.samples[size], default.samples[size])
    return claim.measured(
        "allreduce_nvlink_vs_pcie", ratio["ratio"], (ratio["low"], ratio["high"]),
        reason=f"bus bandwidth of a {human_bytes(size)} all-reduce over {default.world_size} GPUs on NVLink, "
               f"{default.peak:.1f} GB/s, against {without_p2p.peak:.1f} GB/s with NCCL_P2P_LEVEL=LOC (through host "
               "memory and PCIe); ratio of mean times, bootstrap interval")


def worst_gpu_link() -> str | None:
    """The kind of the slowest link between this machine's GPUs ("NV", "PIX" ...); None without nvidia-smi's
    topology or with fewer than two GPUs."""
    links, _ = topology.read_topology()
    worst = topology.assess_ddp_links(links)["worst_link"] if links else None
    return topology.link_kind(worst) if worst else None


def _strong_row(rows, nproc: int) -> dict:
    return next(row for row in rows if row["mode"] == "strong" and row["workers"] == nproc)


def launchers_table(report, spawned: dict, dataparallel: list[float] | None, *, nproc: int, global_batch: int):
    """torchrun against `mp.spawn` (`spawned` None: not run) and DDP against `nn.DataParallel` at `nproc` processes
    or GPUs and the same global batch: median step time, images/s and each launch's seconds (start-up included)."""
    rows = [{"how": f"DDP, {nproc} processes started by torchrun",
             "step_seconds": _strong_row(report.launch.metrics["rows"], nproc)["step_seconds"],
             "launch_seconds": report.launch.duration_seconds}]
    if spawned and spawned["rows"]:
        rows.append({"how": f"DDP, {nproc} processes started by mp.spawn",
                     "step_seconds": _strong_row(spawned["rows"][0]["metrics"]["rows"], nproc)["step_seconds"],
                     "launch_seconds": spawned["seconds"]})
    rows.append({"how": f"nn.DataParallel, one process over {nproc} GPUs",
                 "step_seconds": stats.median(dataparallel) if dataparallel else None, "launch_seconds": None})
    table = pd.DataFrame(rows)
    table["images_per_second"] = global_batch / table["step_seconds"]
    return table


def dataparallel_claim(report, dataparallel: list[float] | None, nproc: int):
    """The article's "DDP scales better than the old DataParallel" (A1 §4.2): DataParallel's step times over DDP's
    (the probe's strong-scaling row at `nproc`) on the same GPUs and global batch, with a bootstrap interval."""
    row = _strong_row(report.launch.metrics["rows"], nproc)
    if not dataparallel or not report.device.startswith("cuda"):
        return claim.not_measurable(
            "ddp_vs_dataparallel", f"needs 2 or more CUDA GPUs: nn.DataParallel splits a batch across GPUs, on "
            f"{report.device} it runs the module as it is; measured instead: DDP over {nproc} processes, "
            f"{row['global_batch'] / row['step_seconds']:.0f} images/s")
    ratio = statistics.ratio_interval(dataparallel, row["step_seconds_all"])
    return claim.measured(
        "ddp_vs_dataparallel", ratio["ratio"], (ratio["low"], ratio["high"]),
        reason=f"{nproc} GPUs, global batch {row['global_batch']}: DataParallel's mean step time over DDP's "
               "(random images already on the GPUs), bootstrap interval")
