"""The articles' environment check (notebook 00): are the declared packages installed, does
torch see a GPU, and do CPU and GPU agree on a small matmul? Advice is computed from what
is found, never canned. `setup` builds the notebook's config, data and datasets.

PyTorch install matrix: https://pytorch.org/get-started/locally/
"""
from __future__ import annotations

import dataclasses
import importlib.metadata as metadata

import torch
from packaging.requirements import Requirement

from course_lib.analysis import claims as claim_records
from course_lib.chapters.setup import ChapterSetup
from course_lib.config import resolve_profile
from course_lib.data.datasets import config_with_data
from course_lib.data.pipeline import build_datasets
from course_lib.instruments.timing import time_repeats


@dataclasses.dataclass(kw_only=True)
class SetupCheck(ChapterSetup):
    """Notebook 00's config, data and datasets (`setup`): its bundle's sizes and sample grid are shown."""

    def line(self) -> str:
        return (f"profile {self.profile}: {self.config.dataset} at {self.config.image_size} px on "
                f"{self.config.device}; machine: {self.hardware}")

    def split_sizes(self) -> dict:
        """Images per split; 0 for a split the dataset does not have."""
        return {split: len(getattr(self.bundle, split) or ()) for split in ("train", "val", "test")}


def setup(profile: str, **params) -> SetupCheck:
    """The data `datasets.config_with_data` picks for `params` (None: the profile's) and its datasets."""
    config, data = config_with_data(profile, **params)
    return SetupCheck(profile=resolve_profile(profile), data=data, config=config, bundle=build_datasets(config))


def package_report() -> list[dict]:
    """Each runtime requirement of the project with the installed version and whether it fits."""
    rows = []
    for text in metadata.requires("course-lib") or []:
        requirement = Requirement(text)
        if requirement.marker and "extra" in str(requirement.marker):
            continue  # dev extras are not needed to run notebooks
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            installed = None
        fits = installed is not None and requirement.specifier.contains(installed, prereleases=True)
        rows.append({"package": requirement.name, "required": str(requirement.specifier) or "any",
                     "installed": installed, "ok": fits})
    return rows


def torch_facts() -> dict:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"torch": torch.__version__, "built_with_cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count(),
            "device_names": [torch.cuda.get_device_name(i) for i in range(count)]}


def install_advice(packages: list[dict], facts: dict) -> list[str]:
    """What to install or fix, derived from the package report and torch's view of CUDA."""
    advice = []
    missing = [row for row in packages if not row["ok"]]
    if missing:
        specs = " ".join(f"'{row['package']}{'' if row['required'] == 'any' else row['required']}'" for row in missing)
        advice.append(f"install or upgrade: pip install {specs}  (or rerun `make venv`)")
    if facts["built_with_cuda"] is None:
        advice.append("this torch is a CPU-only build: for a GPU install a CUDA wheel matching your driver, "
                      "e.g. pip install torch --index-url https://download.pytorch.org/whl/cu124")
    elif not facts["cuda_available"]:
        advice.append(f"torch was built with CUDA {facts['built_with_cuda']} but sees no GPU: on a GPU machine "
                      "check `nvidia-smi` (driver loaded?) and that the driver supports CUDA "
                      f"{facts['built_with_cuda']}; on a CPU-only machine this is expected and the workbook runs "
                      "in the cpu profile")
    if not advice:
        advice.append("nothing to install: every package fits and torch sees "
                      + (", ".join(facts["device_names"]) if facts["device_names"] else "the CPU"))
    return advice


def matmul_check(size: int = 512, seed: int = 0) -> list[dict]:
    """The same fp32 matmul on the CPU and on each GPU: median seconds after a thrown-away warm-up, GFLOP/s and the
    largest difference from the CPU result (the articles: confirm CPU and GPU agree)."""
    generator = torch.Generator().manual_seed(seed)
    a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rows, reference = [], None
    for device in [torch.device("cpu")] + [torch.device("cuda", index) for index in range(gpus)]:
        left, right = a.to(device), b.to(device)
        # TF32 would make the GPU differ from the CPU by design; compare in full fp32.
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            timing = time_repeats(lambda: left @ right, repeats=5, warmup=1, device=device)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        reference = timing.result if reference is None else reference
        diff = (timing.result.cpu() - reference).abs().max().item()
        # fp32 sums of `size` products: allow a relative error that grows like sqrt(size).
        tolerance = 1e-5 * size ** 0.5 * reference.abs().max().item()
        name = "cpu" if device.type == "cpu" else f"cuda:{device.index} ({torch.cuda.get_device_name(device)})"
        rows.append({"device": name, "seconds": timing.median, "gflops": 2 * size ** 3 / timing.median / 1e9,
                     "max_abs_diff_vs_cpu": diff, "agrees": diff <= tolerance})
    return rows


def claims(facts: dict, matmul_rows: list[dict], matmul_size: int) -> list:
    """Notebook 00's claims: torch sees the GPU, the GPU computes what the CPU does and much faster, and the wheel
    brings its own CUDA runtime; without a GPU the GPU ones are not measurable, with what the machine has."""
    gpus = [row for row in matmul_rows if row["device"] != "cpu"]
    cpu_gflops = next(row["gflops"] for row in matmul_rows if row["device"] == "cpu")
    cuda_text = f"torch {facts['torch']} built with CUDA {facts['built_with_cuda']}"
    matmul = f"fp32 {matmul_size}x{matmul_size} matmul"
    if facts["cuda_available"]:
        found = [claim_records.checked("cuda_available", True, value=facts["device_count"],
                                       reason=f"{facts['device_count']} GPU(s): {', '.join(facts['device_names'])}")]
    else:
        found = [claim_records.not_measurable("cuda_available", f"no GPU seen here ({cuda_text}): this is not a GPU "
                                                                "server, or its driver is missing")]
    if gpus:
        worst = max(row["max_abs_diff_vs_cpu"] for row in gpus)
        speed = max(row["gflops"] for row in gpus) / cpu_gflops
        found += [claim_records.checked("cpu_gpu_same_matmul", all(row["agrees"] for row in gpus), value=worst,
                                        reason=f"{matmul}, TF32 off: max |diff| {worst:.2e} over {len(gpus)} GPU(s)"),
                  claim_records.checked("gpu_much_faster", speed >= 10, value=speed,
                                        reason=f"{matmul}: {speed:.0f}x the CPU's {cpu_gflops:.0f} GFLOP/s")]
    else:
        found += [claim_records.not_measurable(key, f"no GPU to compare with; the CPU multiplies at {cpu_gflops:.0f} "
                                                    f"GFLOP/s ({matmul_size}x{matmul_size} fp32)")
                  for key in ("cpu_gpu_same_matmul", "gpu_much_faster")]
    if facts["built_with_cuda"]:  # a property of the installed wheel: shown, not measured
        return found + [claim_records.demonstrated(
            "wheel_ships_cuda_runtime", True, f"{cuda_text}: the runtime comes in the wheel; only a driver is needed")]
    return found + [claim_records.not_measurable("wheel_ships_cuda_runtime",
                                                 f"the CPU-only torch {facts['torch']} is installed here")]
