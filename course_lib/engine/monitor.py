"""The utilisation monitor: a background thread that samples, every `monitor_interval` seconds while
the engine trains, each CUDA device's SM utilisation, memory in use and power through NVML (the
library nvidia-smi reads; https://docs.nvidia.com/deploy/nvml-api/) and the training process's CPU %
and resident memory through psutil (its DataLoader workers included). `workbook train -p
monitor_interval=1` writes the timeline to `output_dir/monitor.csv` and its summary to the ledger row.

    with UtilisationMonitor(0.5, device) as monitor:
        ...train...
    monitor.summary()  # mean and p5 utilisation, peak memory, the sampler's own CPU cost

The sampler's cost is measured, not assumed: the thread's own CPU seconds over the wall seconds it
ran (`overhead_fraction`), the share of one core it took from training.
"""
from __future__ import annotations

import csv
import threading
import time
from pathlib import Path

import numpy as np
import torch

TIMELINE_FILE = "monitor.csv"
SERIES_POINTS = 40  # points of the down-sampled series kept in the ledger row (the report's small plot)


class UtilisationMonitor:
    """Samples at t = 0, interval, 2 x interval, ... from `start()` until `stop()` (drift-free: each
    wake-up is scheduled from the start, not from the previous sample). `samples` holds one dict per
    sample: seconds since start, process CPU % (100 = one core) and RSS bytes, and per GPU i
    `gpu{i}_utilisation_percent`, `gpu{i}_memory_bytes`, `gpu{i}_power_watts`."""

    def __init__(self, interval_seconds: float, device: torch.device | str | None = None):
        if not interval_seconds > 0:
            raise ValueError(f"the monitor's interval must be above 0 seconds, got {interval_seconds!r}")
        self.interval = float(interval_seconds)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.samples: list[dict] = []
        self.gpu_note = ""  # why GPU figures are absent ("" when NVML answered)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpus: list = []  # NVML handles of the devices this process trains on
        self._nvml = None
        self._processes: dict[int, object] = {}  # pid -> psutil.Process, so cpu_percent has its previous reading
        self.started = self.stopped = None  # time.perf_counter() at start and stop
        self.sampler_cpu_seconds = 0.0

    # --- verbs ---
    def start(self) -> UtilisationMonitor:
        import psutil

        self._root = psutil.Process()
        self._open_nvml()
        self._cpu_percent()  # psutil's first cpu_percent() of a process is 0.0: prime it
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="workbook-utilisation-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        """Stop the thread (within one sample's time) and return the samples."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.stopped = time.perf_counter()
            if self._nvml is not None:
                self._nvml.nvmlShutdown()
                self._nvml = None
        return self.samples

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- sampling ---
    def _open_nvml(self) -> None:
        if self.device.type != "cuda":
            self.gpu_note = f"not measurable here: NVML reads NVIDIA GPUs, this run trains on {self.device.type}"
            return
        try:
            import pynvml  # nvidia-ml-py: imported only on CUDA
        except ImportError:
            self.gpu_note = "not measurable here: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:  # no driver library, or a driver too old for this binding
            self.gpu_note = f"not measurable here: NVML did not start ({error})"
            return
        self._nvml = pynvml
        indices = [self.device.index if self.device.index is not None else torch.cuda.current_device()]
        for index in indices:
            # CUDA_VISIBLE_DEVICES renumbers devices for torch but not for NVML: match them by PCI bus id.
            props = torch.cuda.get_device_properties(index)
            bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            try:
                self._gpus.append(pynvml.nvmlDeviceGetHandleByPciBusId(bus_id))
            except pynvml.NVMLError:
                self._gpus.append(pynvml.nvmlDeviceGetHandleByIndex(index))

    def _cpu_percent(self) -> tuple[float, int]:
        """(CPU % of the process and its children, their resident bytes together)."""
        import psutil

        percent, rss = 0.0, 0
        alive = set()
        for process in [self._root, *self._root.children(recursive=True)]:
            known = self._processes.setdefault(process.pid, process)
            try:
                percent += known.cpu_percent(None)
                rss += known.memory_info().rss
                alive.add(process.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # a worker that ended between listing and reading
        self._processes = {pid: p for pid, p in self._processes.items() if pid in alive}
        return percent, rss

    def sample(self) -> dict:
        """One reading now (the thread calls it; a test can too)."""
        percent, rss = self._cpu_percent()
        row = {"seconds": time.perf_counter() - self.started, "cpu_percent": percent, "rss_bytes": rss}
        for i, handle in enumerate(self._gpus):
            nvml = self._nvml
            row[f"gpu{i}_utilisation_percent"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            row[f"gpu{i}_memory_bytes"] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            row[f"gpu{i}_power_watts"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000  # NVML reports milliwatts
        return row

    def _run(self) -> None:
        cpu_start = time.thread_time()
        count = 0
        while True:
            self.samples.append(self.sample())
            count += 1
            wait = self.started + count * self.interval - time.perf_counter()
            if self._stop.wait(max(0.0, wait)):
                break
        self.sampler_cpu_seconds = time.thread_time() - cpu_start

    # --- results ---
    def summary(self) -> dict:
        """Flat numbers for the ledger row (prefixed `monitor_`) plus a short series for the report's plot."""
        wall = ((self.stopped or time.perf_counter()) - self.started) if self.started else 0.0
        out = {"monitor_samples": len(self.samples), "monitor_interval_seconds": self.interval,
               "monitor_seconds": wall, "monitor_overhead_fraction": self.sampler_cpu_seconds / wall if wall else 0.0}
        if not self.samples:
            return out
        out["monitor_peak_rss_bytes"] = max(s["rss_bytes"] for s in self.samples)
        cpu = np.array([s["cpu_percent"] for s in self.samples[1:]])  # sample 0 has no interval to measure over
        if len(cpu):
            out.update(monitor_cpu_percent_mean=float(cpu.mean()), monitor_cpu_percent_p5=float(np.percentile(cpu, 5)))
        else:  # a run shorter than one interval: a mean of 0% from the start-up sample would be false
            out["monitor_cpu_note"] = (f"not measured: the run ended within one interval ({self.interval:g} s), "
                                       "so only the start-up sample exists; use a shorter monitor_interval")
        if "gpu0_utilisation_percent" in self.samples[0]:
            gpu = np.array([s["gpu0_utilisation_percent"] for s in self.samples])
            out.update(monitor_gpu_utilisation_mean=float(gpu.mean()),
                       monitor_gpu_utilisation_p5=float(np.percentile(gpu, 5)),
                       monitor_gpu_peak_memory_bytes=max(s["gpu0_memory_bytes"] for s in self.samples),
                       monitor_gpu_power_watts_mean=float(np.mean([s["gpu0_power_watts"] for s in self.samples])))
            out["monitor_series"] = downsample(list(gpu))
            out["monitor_series_name"] = "GPU utilisation %"
        else:
            out["monitor_gpu_note"] = self.gpu_note
            if len(cpu):
                out["monitor_series"] = downsample(list(cpu))
                out["monitor_series_name"] = "process CPU % (100 = one core)"
        return out

    def write_csv(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        names = list(self.samples[0]) if self.samples else ["seconds", "cpu_percent", "rss_bytes"]
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=names)
            writer.writeheader()
            writer.writerows(self.samples)
        return path


def downsample(values: list[float], points: int = SERIES_POINTS) -> list[float]:
    """At most `points` values: the means of equal slices (a short series that keeps the shape)."""
    if len(values) <= points:
        return [float(v) for v in values]
    return [float(np.mean(part)) for part in np.array_split(np.asarray(values, dtype=float), points)]


def sparkline(values: list[float]) -> str:
    """A one-line text plot for the terminal ("▁▃▅█"), scaled from the smallest to the largest value."""
    if not values:
        return ""
    bars = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(bars[min(len(bars) - 1, int((v - low) / span * len(bars)))] for v in values)


def summary_line(summary: dict) -> str:
    """The monitor's one line in `workbook train`'s output."""
    parts = [f"monitor: {summary['monitor_samples']} samples every {summary['monitor_interval_seconds']:g} s"]
    if "monitor_gpu_utilisation_mean" in summary:
        parts.append(f"GPU utilisation mean {summary['monitor_gpu_utilisation_mean']:.0f}% (p5 "
                     f"{summary['monitor_gpu_utilisation_p5']:.0f}%), peak GPU memory "
                     f"{summary['monitor_gpu_peak_memory_bytes'] / 2**30:.2f} GiB")
    elif summary.get("monitor_gpu_note"):
        parts.append(f"GPU {summary['monitor_gpu_note']}")
    if "monitor_cpu_percent_mean" in summary:
        parts.append(f"CPU mean {summary['monitor_cpu_percent_mean']:.0f}% (p5 {summary['monitor_cpu_percent_p5']:.0f}%), "
                     f"peak RSS {summary['monitor_peak_rss_bytes'] / 2**20:.0f} MiB")
    elif "monitor_cpu_note" in summary:
        parts.append(f"CPU share {summary['monitor_cpu_note']}; peak RSS {summary['monitor_peak_rss_bytes'] / 2**20:.0f} MiB")
    parts.append(f"sampler overhead {summary['monitor_overhead_fraction']:.2%} of a core")
    series = summary.get("monitor_series")
    return "; ".join(parts) + (f"\n  {summary['monitor_series_name']}: {sparkline(series)}" if series else "")
