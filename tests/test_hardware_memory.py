"""The chapter behind notebook 01: claims from small fake measurements (no GPU needed)."""
import pytest

from course_lib.analysis import claims
from course_lib.chapters import hardware_memory

GB = 10**9
FACTS = {"cpu": {"physical_cores": 32, "ram_bytes": 256 * GB}, "gpus": [{"name": "a"}, {"name": "b"}],
         "disk": {"kind": "nvme", "block_device": "nvme0n1", "read_sequential_mb_per_s": 2000.0,
                  "read_random_mb_per_s": 40.0, "read_random_reads_per_s": 10000.0}}
MATMUL = [{"device": "cpu", "dtype": "fp32", "speed_vs_fp32": 1.0}, {"device": "cpu", "dtype": "bf16", "speed_vs_fp32": 0.2},
          {"device": "cuda:0", "dtype": "fp32", "speed_vs_fp32": 1.0}, {"device": "cuda:0", "dtype": "fp16", "speed_vs_fp32": 6.0}]


def r50(measured=None):
    return {"estimate_bytes": {256: 12 * GB, 512: 23 * GB}, "fp32_estimate_bytes": 22 * GB, "activation_share": 0.9,
            "largest_batch_24gb": 300, "measured_bytes": measured or {}}


@pytest.fixture(autouse=True)
def fake_hardware(monkeypatch):
    monkeypatch.setattr(claims, "_hardware", lambda: "fake machine")


def test_on_a_cpu_the_resnet50_claim_quotes_the_estimate():
    claim = hardware_memory.resnet50_claim(r50())
    assert claim.verdict == claims.NOT_MEASURABLE and "12.0 GB" in claim.reason and "+92%" in claim.reason


def test_on_a_gpu_the_resnet50_claim_is_the_measured_peak():
    claim = hardware_memory.resnet50_claim(r50({256: 14 * GB, 512: 19 * GB}))
    assert claim.measured == pytest.approx(14.0) and claim.verdict == claims.HOLDS and "+36%" in claim.reason
    growth = hardware_memory.memory_claims(r50({256: 14 * GB, 512: 19 * GB}), "-")[0]
    assert growth.key == "batch_doubling_memory" and growth.verdict == claims.HOLDS


def test_every_claim_of_notebook_01_with_its_verdict():
    found = {c.key: c for c in hardware_memory.claims(r50(), "resnet18 64 px 16->32: +80%", FACTS, MATMUL, 8)}
    assert list(found) == ["resnet50_amp_memory", "batch_doubling_memory", "amp_memory_estimate", "card_24gb_batch256",
                           "cores_and_ram_per_gpu", "workers_half_the_cores", "random_reads_slower", "tensor_cores_fp16"]
    assert found["batch_doubling_memory"].verdict == claims.REFUTED  # +92% estimated
    assert found["amp_memory_estimate"].verdict == claims.HOLDS  # 12 / 22 GB
    assert found["card_24gb_batch256"].verdict == claims.HOLDS
    assert found["cores_and_ram_per_gpu"].verdict == claims.HOLDS  # 16 cores, 128 GB per GPU
    assert found["workers_half_the_cores"].verdict == claims.HOLDS  # 32 // 2 // 2
    assert found["random_reads_slower"].verdict == claims.HOLDS
    assert found["tensor_cores_fp16"].measured == pytest.approx(6.0)


def test_without_a_gpu_the_gpu_claims_are_not_measurable():
    facts = {**FACTS, "gpus": []}
    found = {c.key: c for c in hardware_memory.machine_claims(facts, MATMUL[:2], 16)}
    assert found["cores_and_ram_per_gpu"].verdict == found["tensor_cores_fp16"].verdict == claims.NOT_MEASURABLE
    assert "bf16 0.2x" in found["tensor_cores_fp16"].reason


def test_sweep_growth_text():
    import pandas as pd

    sweep = pd.DataFrame({"model": ["m", "m"], "image_size": [64, 64], "batch_size": [16, 32],
                          "measured_peak_bytes": [100, 180]})
    assert hardware_memory.sweep_growth_text(sweep) == "m 64 px 16->32: +80%"


def test_setup_picks_the_sweep_device_and_disk_folder(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from course_lib import machine

    monkeypatch.setattr(machine, "describe_hardware", lambda: "fake machine")
    setup = hardware_memory.setup("smoke", str(tmp_path), batch_size=6, precision=None)
    assert (setup.profile, setup.sweep_profile, setup.config.batch_size) == ("smoke", "smoke", 6)
    assert setup.probe_folder == tmp_path and setup.line().splitlines()[1] == "machine: fake machine"
    assert hardware_memory.setup("smoke", memory_sweep="cpu").sweep_profile == "cpu"
    # a config that names CUDA on a machine without one measures on the CPU, under a memory cap
    monkeypatch.setattr(hardware_memory.torch.cuda, "is_available", lambda: False)
    cpu = hardware_memory.setup("smoke", device="cuda")
    assert cpu.device.type == "cpu"
    estimate = SimpleNamespace(at_batch=lambda batch: SimpleNamespace(total_bytes=1000 * batch))
    probe = SimpleNamespace(estimate=lambda batch: estimate)
    assert cpu.memory_cap(probe, {"batch_sizes": [2, 4, 8]}) == 16_000  # the estimate at twice the largest batch
    assert cpu.memory_cap(probe, {"batch_sizes": [2, 4, 8]}, cap_mib=3) == 3 * 2**20
    monkeypatch.setattr(hardware_memory.torch.cuda, "is_available", lambda: True)
    assert hardware_memory.setup("smoke", device="cuda").memory_cap(probe, {"batch_sizes": [8]}) is None
