"""GPU topology from `nvidia-smi topo -m`: which GPUs talk over NVLink, PCIe switches or the CPU's
interconnect, and whether the links suit DDP (the legend of `nvidia-smi topo -m` names link types).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from course_lib.measure.inventory import _run

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Rough order of peer-to-peer bandwidth, best first; DDP's all-reduce runs at the worst pair's pace.
_LINK_RANK = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC")
LINK_DESCRIPTIONS = {
    "X": "self",
    "NV": "NVLink (bonded set of # links)",
    "PIX": "PCIe, at most one PCIe bridge",
    "PXB": "PCIe, several PCIe bridges, no host bridge",
    "PHB": "PCIe through a host bridge (the CPU)",
    "NODE": "PCIe plus the interconnect between host bridges within a NUMA node",
    "SYS": "PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI)",
    "SOC": "PCIe plus the SMP interconnect between sockets (old name of SYS)",
}


@dataclass
class Topology:
    """`nvidia-smi topo -m` as data: `links[i][j]` is the code between devices `devices[i]` and
    `devices[j]` (GPUs first, then NICs); affinity columns per GPU."""
    devices: list[str]
    links: list[list[str]]
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    legend: dict[str, str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    def link(self, a: str, b: str) -> str:
        return self.links[self.devices.index(a)][self.devices.index(b)]

    def gpu_matrix(self) -> list[list[str]]:
        return [[self.link(a, b) for b in self.gpus] for a in self.gpus]

    def to_dict(self) -> dict:
        return {**asdict(self), "gpus": self.gpus, "gpu_matrix": self.gpu_matrix()}


def link_kind(code: str) -> str:
    """"NV12" -> "NV"; "PIX" -> "PIX"; " X " -> "X"."""
    code = code.strip().upper()
    return "NV" if re.fullmatch(r"NV\d+", code) else code


def nvlink_count(code: str) -> int:
    """Bonded NVLinks in a code: "NV12" -> 12, anything else -> 0."""
    match = re.fullmatch(r"NV(\d+)", code.strip().upper())
    return int(match.group(1)) if match else 0


def _cells(line: str) -> list[str]:
    # Columns are tab separated; some versions pad with runs of spaces instead.
    return [cell.strip() for cell in re.split(r"\t+| {2,}", line) if cell.strip()]


def parse_topology(text: str) -> Topology:
    """Parse the matrix, affinity columns and legend of `nvidia-smi topo -m` (every format since
    driver 4xx: with or without NIC rows, `NUMA Affinity`, `GPU NUMA ID`, ANSI underlines)."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    # The header names GPU0 first; device rows also start with GPU0 but hold an "X" (self) cell.
    header_index = next((i for i, line in enumerate(lines)
                         if _cells(line)[:1] == ["GPU0"] and "X" not in _cells(line)), None)
    if header_index is None:
        raise ValueError("no `nvidia-smi topo -m` header (a line of column names starting with GPU0) found")
    columns = _cells(lines[header_index])
    device_columns = [c for c in columns if re.fullmatch(r"(GPU|NIC)\d+|mlx\d+_\d+|\w+_\d+", c)]
    extra_columns = columns[len(device_columns):]
    rows: dict[str, list[str]] = {}
    extras: dict[str, list[str]] = {}
    for line in lines[header_index + 1:]:
        cells = _cells(line)
        if not cells or cells[0] not in device_columns:
            if rows:  # the matrix ends at the first line that is not a device row
                break
            continue
        links = cells[1:1 + len(device_columns)]
        if len(links) < len(device_columns):
            raise ValueError(f"row {cells[0]} has {len(links)} link cells, expected {len(device_columns)}")
        rows[cells[0]] = links
        extras[cells[0]] = cells[1 + len(device_columns):]
    devices = [d for d in device_columns if d in rows]
    if not devices:
        raise ValueError("`nvidia-smi topo -m` output has a header but no device rows")
    index = [device_columns.index(d) for d in devices]
    links = [[rows[d][i] for i in index] for d in devices]
    topology = Topology(devices=devices, links=links)
    for device in devices:
        values = dict(zip(extra_columns, extras[device]))
        for column, affinity in (("CPU Affinity", topology.cpu_affinity), ("NUMA Affinity", topology.numa_affinity)):
            if column in values:
                affinity[device] = values[column]
    for line in lines:
        legend = re.match(r"\s+(X|SYS|SOC|NODE|PHB|PXB|PIX|NV#|NVL?)\s+=\s+(.*)", line)
        if legend:
            topology.legend[legend.group(1)] = legend.group(2).strip()
        nic = re.match(r"\s+(NIC\d+):\s+(\S+)", line)
        if nic:
            topology.nic_names[nic.group(1)] = nic.group(2)
    return topology


def read_topology() -> tuple[Topology | None, str]:
    """(parsed `nvidia-smi topo -m`, note); (None, why) when it cannot be had."""
    text = _run(["nvidia-smi", "topo", "-m"])
    if text is None:
        return None, "nvidia-smi not found or failed"
    try:
        return parse_topology(text), "nvidia-smi topo -m"
    except ValueError as error:
        return None, f"could not parse nvidia-smi topo -m: {error}"


def assess_ddp_links(topology: Topology) -> dict:
    """The slowest GPU-to-GPU link (DDP's all-reduce moves at its pace) and what it means."""
    gpus = topology.gpus
    pairs = [(a, b, topology.link(a, b)) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    if not pairs:
        return {"worst_link": None, "nvlink_pairs": 0, "pairs": 0, "suits_ddp": True,
                "reason": "one GPU: nothing to all-reduce between GPUs"}
    def rank(code):
        kind = link_kind(code)
        return _LINK_RANK.index(kind) if kind in _LINK_RANK else len(_LINK_RANK)
    worst = max(pairs, key=lambda pair: rank(pair[2]))
    nvlink_pairs = sum(link_kind(code) == "NV" for _, _, code in pairs)
    kind = link_kind(worst[2])
    suits = kind in ("NV", "PIX", "PXB")
    reason = (f"{nvlink_pairs} of {len(pairs)} GPU pairs use NVLink; slowest link {worst[0]}-{worst[1]} is "
              f"{worst[2]} ({LINK_DESCRIPTIONS.get(kind, 'unknown link')})")
    return {"worst_link": worst[2], "nvlink_pairs": nvlink_pairs, "pairs": len(pairs), "suits_ddp": suits,
            "reason": reason}


def plot_topology(topology: Topology, title: str = ""):
    """The GPU-to-GPU link matrix as a coloured grid (NVLink green, PCIe kinds warmer)."""
    import matplotlib.pyplot as plt
    import numpy as np

    matrix = topology.gpu_matrix()
    order = ("X", *_LINK_RANK)
    codes = np.array([[order.index(link_kind(c)) if link_kind(c) in order else len(order) for c in row]
                      for row in matrix])
    figure, axis = plt.subplots(figsize=(1 + 0.6 * len(matrix), 0.6 + 0.6 * len(matrix)))
    axis.imshow(codes, cmap="RdYlGn_r", vmin=0, vmax=len(order))
    for i, row in enumerate(matrix):
        for j, cell in enumerate(row):
            axis.text(j, i, cell, ha="center", va="center", fontsize=8)
    axis.set_xticks(range(len(matrix)), topology.gpus, fontsize=8)
    axis.set_yticks(range(len(matrix)), topology.gpus, fontsize=8)
    axis.set_title(title or "GPU-to-GPU links")
    return figure
