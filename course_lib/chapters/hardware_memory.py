"""Notebook 01's facts and memory measurements turned into the articles' claims (`analysis.claims`):
ResNet-50's mixed-precision training memory (measured on a GPU, the workbook's estimate elsewhere), what
doubling the batch adds, cores and RAM per GPU, the workers rule, random vs sequential reads, and
whether reduced-precision matmuls are fast here. The measuring lives in `measure.memory`,
`measure.doctor` and `measure.peak`; this module compares, and builds the notebook's config (`setup`)."""
from __future__ import annotations

import dataclasses

import torch

from course_lib.analysis import claims as claim_records
from course_lib.chapters.setup import ChapterSetup
from course_lib.config import make_config, resolve_profile
from course_lib.instruments import peak_memory
from course_lib.measure import doctor, memory, memory_probe
from course_lib.paths import resolve_path


@dataclasses.dataclass(kw_only=True)
class HardwareSetup(ChapterSetup):
    """Notebook 01's config (the memory estimate's model, batch, precision and optimizer), sweep and disk folder."""

    sweep_profile: str  # which estimate-vs-measured sweep runs (`memory_probe.sweep_plan`)
    probe_folder: object  # Path the disk probe reads

    @property
    def device(self) -> torch.device:
        """Where the memory is measured: the CUDA GPU the config names, else the CPU (never an error here)."""
        return torch.device("cuda" if self.config.device.startswith("cuda") and torch.cuda.is_available() else "cpu")

    def line(self) -> str:
        return (f"profile {self.profile} -> sweep {self.sweep_profile}; {self.config.model} at "
                f"{self.config.image_size} px on {self.device}\nmachine: {self.hardware}")

    def memory_cap(self, probe, plan: dict, cap_mib: int = 0) -> int | None:
        """Bytes the largest-batch search may use: on a CPU `cap_mib` (0: the estimate at twice the plan's largest
        batch, so the search stops before the machine swaps); on a GPU None (it stops at CUDA's out-of-memory)."""
        if self.device.type != "cpu":
            return None
        return cap_mib * 2**20 or probe.estimate(2).at_batch(2 * plan["batch_sizes"][-1]).total_bytes


def setup(profile: str, data_dir: str | None = None, memory_sweep: str = "auto", **params) -> HardwareSetup:
    """The profile with `params` (None: the profile's), the sweep (`memory_sweep` auto: the profile's) and the disk
    probe's folder: data_dir, else the config's, else the real data every run finds, or the committed sample."""
    config, resolved = make_config(profile, **params), resolve_profile(profile)
    folder = data_dir or config.data_dir
    return HardwareSetup(profile=resolved, config=config,
                         sweep_profile=resolved if memory_sweep == "auto" else memory_sweep,
                         probe_folder=resolve_path(folder) if folder else doctor.default_data_folder())


def resnet50_memory(device) -> dict:
    """The article's setting (ResNet-50, 224 px, fp16 autocast, SGD) at batch 256 and 512: the estimate (on the meta
    device) and, on CUDA, the measured peak of one training step (None where it ran out of memory)."""
    estimate = memory.estimate_training_memory("resnet50", 256, 224, precision="fp16", device="meta")
    fp32 = memory.estimate_training_memory("resnet50", 256, 224, precision="off", device="meta")
    result = {"estimate_bytes": {256: estimate.total_bytes, 512: estimate.at_batch(512).total_bytes},
              "fp32_estimate_bytes": fp32.total_bytes,
              "activation_share": estimate.activations_bytes / estimate.total_bytes,
              "largest_batch_24gb": memory.largest_batch_within(estimate, 24 * 10**9), "measured_bytes": {}}
    device = torch.device(device)
    if device.type == "cuda":
        probe = memory_probe.TrainingStepProbe("resnet50", 224, "fp16", "sgd", device=device)
        for batch in (256, 512):
            try:
                result["measured_bytes"][batch] = probe.peak_bytes(batch)
            except torch.OutOfMemoryError:
                result["measured_bytes"][batch] = None
                peak_memory.release_memory(device)
        del probe
        peak_memory.release_memory(device)
    return result


def _growth(pair: dict) -> float | None:
    return pair[512] / pair[256] - 1 if pair.get(256) and pair.get(512) else None


def resnet50_claim(r50: dict):
    estimate, measured = r50["estimate_bytes"], r50["measured_bytes"]
    estimate_text = (f"the workbook's estimate (parameters, gradients, momentum, activations counted on the meta "
                     f"device) is {estimate[256] / 1e9:.1f} GB, and batch 512 adds {_growth(estimate):+.0%} "
                     f"(activations are {r50['activation_share']:.0%} of the total; the article: +30-40%)")
    if not measured.get(256):
        why = "no CUDA GPU" if not measured else "batch 256 ran out of GPU memory"
        return claim_records.not_measurable("resnet50_amp_memory", f"{why}: {estimate_text}")
    growth = _growth(measured)
    return claim_records.measured(
        "resnet50_amp_memory", measured[256] / 1e9,
        reason="torch.cuda.max_memory_allocated of one fp16-autocast SGD step (tensors only; nvidia-smi adds "
               "the CUDA context and cached blocks); batch 512: "
               + (f"{measured[512] / 1e9:.1f} GB ({growth:+.0%}; the article: +30-40%)" if growth is not None
                  else "out of memory") + f"; {estimate_text}")


def memory_claims(r50: dict, sweep_growth: str):
    """The doubling-the-batch, AMP-halves-memory and 24 GB claims, from the estimate (and measurements)."""
    measured = r50["measured_bytes"].get(512)
    growth = _growth(r50["measured_bytes"] if measured else r50["estimate_bytes"])
    source = "measured" if measured else "estimated"
    ratio = r50["estimate_bytes"][256] / r50["fp32_estimate_bytes"]
    largest = r50["largest_batch_24gb"]
    return [
        claim_records.checked("batch_doubling_memory", 0.30 <= growth <= 0.40, value=100 * growth,
                              reason=f"ResNet-50 224 px fp16, batch 256 -> 512: {growth:+.0%} ({source}); this "
                                     f"machine's sweep, measured: {sweep_growth}"),
        claim_records.checked("amp_memory_estimate", 0.4 <= ratio <= 0.6, value=ratio,
                              reason=f"estimate fp16 / fp32 at batch 256: {ratio:.2f} (fp32 master weights, "
                                     "gradients and optimizer state do not shrink; notebook 03 measures it)"),
        claim_records.checked("card_24gb_batch256", 256 <= largest < 512, value=largest,
                              reason=f"estimate: the largest batch within 24 GB is {largest} (tensors only; the CUDA "
                                     "context, cuDNN workspaces and fragmentation take more)"),
    ]


def machine_claims(facts: dict, matmul_rows: list[dict], recommended_workers: int):
    """Cores and RAM per GPU, the workers rule, random vs sequential reads, fast reduced precision."""
    cores, ram, gpus = facts["cpu"]["physical_cores"], facts["cpu"]["ram_bytes"], len(facts["gpus"])
    disk = facts["disk"]
    sequential, random_reads = disk.get("read_sequential_mb_per_s"), disk.get("read_random_mb_per_s")
    by_device: dict[str, dict] = {}
    for row in matmul_rows:
        by_device.setdefault(row["device"], {})[row["dtype"]] = row.get("speed_vs_fp32")
    reduced = {d: {k: v for k, v in s.items() if k in ("bf16", "fp16") and v} for d, s in by_device.items()}
    text = "; ".join(f"{d}: " + ", ".join(f"{k} {v:.2g}x" for k, v in s.items()) for d, s in reduced.items())
    gpu_speeds = [v for d, s in reduced.items() if d != "cpu" for v in s.values()]
    return [
        claim_records.checked(
            "cores_and_ram_per_gpu", cores / gpus >= 16 and ram / gpus >= 64e9, value=cores / gpus,
            reason=f"this machine: {cores / gpus:.0f} physical cores and {ram / gpus / 1e9:.0f} GB RAM per GPU ({gpus} "
                   "GPUs); notebook 02 measures how many cores a GPU needs (cpu_cores_per_gpu)") if gpus else
        claim_records.not_measurable("cores_and_ram_per_gpu",
                                     f"no GPU; this machine has {cores} physical cores and {ram / 1e9:.0f} GB"),
        claim_records.checked(
            "workers_half_the_cores", recommended_workers == max(1, cores // 2 // max(1, gpus)),
            value=recommended_workers,
            reason=f"{cores} physical cores, {max(1, gpus)} training process(es) -> the doctor recommends "
                   f"num_workers={recommended_workers}; notebook 02 measures where throughput stops growing"),
        claim_records.checked(
            "random_reads_slower", random_reads < sequential / 2, value=random_reads / sequential,
            reason=f"{disk['kind']} disk ({disk['block_device']}): random 4 KiB {random_reads:.1f} MiB/s "
                   f"({disk['read_random_reads_per_s']:.0f} reads/s) vs sequential {sequential:.0f} MiB/s")
        if sequential and random_reads else
        claim_records.not_measurable("random_reads_slower", f"no files to read: {disk.get('read_note')}"),
        claim_records.checked("tensor_cores_fp16", max(gpu_speeds) > 1.1, value=max(gpu_speeds),
                              reason=f"{text} fp32 matmul") if any(d != "cpu" for d in reduced) else
        claim_records.not_measurable("tensor_cores_fp16", f"no GPU, so no tensor cores; {text} fp32 matmul"),
    ]


def claims(r50: dict, sweep_growth: str, facts: dict, matmul_rows: list[dict], recommended_workers: int):
    """Every claim notebook 01 shows: ResNet-50's AMP memory first, then the qualitative ones."""
    return [resnet50_claim(r50), *memory_claims(r50, sweep_growth),
            *machine_claims(facts, matmul_rows, recommended_workers)]


def sweep_growth_text(sweep) -> str:
    """The measured growth of the last batch doubling of each (model, image size) in the sweep."""
    parts = []
    for (model, size), group in sweep.groupby(["model", "image_size"]):
        if len(group) >= 2:
            last, before = group.iloc[-1], group.iloc[-2]
            parts.append(f"{model} {size} px {before.batch_size}->{last.batch_size}: "
                         f"{last.measured_peak_bytes / before.measured_peak_bytes - 1:+.0%}")
    return ", ".join(parts) or "-"
