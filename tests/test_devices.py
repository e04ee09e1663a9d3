"""Device choice beyond CUDA, tested by faking what torch reports: `auto` picks cuda, then mps, then
cpu; the mps paths of precision, the matmul probe, peak memory, the doctor and DDP set-up."""
import functools
import types

import pytest
import torch

from course_lib import devices
from course_lib.config import ConfigError, make_config
from course_lib.engine import auto_precision
from course_lib.instruments import peak_memory
from course_lib.measure import doctor, inventory, peak


def fake_machine(monkeypatch, *, cuda: bool, mps: bool) -> None:
    # lru_cache: torch._dynamo (imported by timm) reads __wrapped__ of torch's own is_available.
    monkeypatch.setattr(torch.cuda, "is_available", functools.lru_cache(lambda: cuda))
    monkeypatch.setattr(torch.backends.mps, "is_available", functools.lru_cache(lambda: mps))


@pytest.mark.parametrize("cuda, mps, expected", [
    (True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"), (False, False, "cpu")])
def test_auto_picks_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, expected):
    fake_machine(monkeypatch, cuda=cuda, mps=mps)
    assert devices.accelerator() == expected
    assert devices.resolve_device("auto").type == expected


def test_explicit_mps_without_it_is_one_line_naming_the_fix(monkeypatch):
    fake_machine(monkeypatch, cuda=False, mps=False)
    with pytest.raises(ConfigError, match="no Apple-silicon GPU.*device=cpu"):
        devices.resolve_device("mps")
    assert devices.transfer_device("mps") is None and devices.transfer_device("auto") is None


def test_transfer_device_is_the_mps_gpu_on_apple_silicon(monkeypatch):
    fake_machine(monkeypatch, cuda=False, mps=True)
    assert devices.transfer_device("auto") == torch.device("mps")
    assert devices.transfer_device("cuda") is None  # asked for CUDA on a Mac: a CPU-only timing
    assert devices.transfer_device("cpu") is None


def test_synchronize_waits_for_mps_work(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("mps"))
    devices.synchronize("mps")
    devices.synchronize("cpu")
    assert calls == ["mps"]


def test_what_mps_skips_is_named_and_pinned_memory_only_helps_cuda(monkeypatch):
    for feature in ("ddp", "nvjpeg", "compile", "pin_memory", "peak_memory"):
        assert devices.unsupported_on("mps", feature)
    assert devices.unsupported_on("cpu", "nvjpeg") and devices.unsupported_on("cpu", "ddp") is None
    fake_machine(monkeypatch, cuda=False, mps=True)
    assert devices.pin_memory_helps() is False
    assert devices.pin_memory_helps("mps") is False


def test_the_auto_profile_trains_on_mps_on_apple_silicon(monkeypatch):
    fake_machine(monkeypatch, cuda=False, mps=True)
    config = make_config("auto")
    assert config.device == "mps" and config.image_size == make_config("cpu").image_size
    assert make_config("cpu").device == "cpu"  # an explicit profile is what it says
    assert make_config("auto", device="cpu").device == "cpu"
    fake_machine(monkeypatch, cuda=False, mps=False)
    assert make_config("auto").device == "cpu"
    with pytest.raises(ConfigError, match="mps"):
        make_config("cpu", device="metal")


def test_a_reduced_precision_mps_cannot_run_is_left_out_not_fatal(monkeypatch):
    def raising(*args, **kwargs):
        raise TypeError("BFloat16 is not supported on MPS")

    monkeypatch.setattr(auto_precision, "step_seconds", raising)
    on_mps = types.SimpleNamespace(device=torch.device("mps"))
    assert auto_precision._candidate_seconds(None, on_mps, None, "bf16", 1.0) is None
    on_cpu = types.SimpleNamespace(device=torch.device("cpu"))
    with pytest.raises(TypeError):  # on CPU and CUDA the candidates run: a failure is a real error
        auto_precision._candidate_seconds(None, on_cpu, None, "bf16", 1.0)
    assert auto_precision.decide({"off": 1.0, "bf16": None, "fp16": 0.5}) == "fp16"


def test_the_matmul_probe_covers_mps_dtypes(monkeypatch):
    fake_machine(monkeypatch, cuda=False, mps=True)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: True)
    assert [peak.dtype_supported("mps", name) for name in peak.DTYPE_NAMES] == [True, False, True, True]
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: False)  # bf16 from macOS 14
    assert [peak.dtype_supported("mps", name) for name in peak.DTYPE_NAMES] == [True, False, True, False]
    fake_machine(monkeypatch, cuda=False, mps=False)
    assert not peak.dtype_supported("mps", "fp32")


def test_mps_peak_memory_is_the_allocator_growth_across_the_step(monkeypatch):
    allocated = iter([1000, 5000])
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: next(allocated))
    assert peak_memory.peak_bytes_during(lambda: calls.append("step"), "mps") == 4000
    assert calls == ["sync", "empty", "step", "sync"]  # the cache is emptied before, the work waited for
    assert peak_memory.peak_memory_kind("mps") == "mps_driver_allocated_growth"


def test_the_doctor_reports_the_mps_gpu_and_advice(monkeypatch):
    fake_machine(monkeypatch, cuda=False, mps=True)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 12 * 2 ** 30)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    facts = doctor.collect_facts(measure=False)
    assert facts["mps"] == {"built": True, "available": True, "recommended_max_memory_bytes": 12 * 2 ** 30}
    topics = {item["topic"]: item for item in facts["recommendations"]}
    assert "mps" in topics["device"]["advice"]
    assert topics["pin_memory"]["advice"] == "leave pin_memory=False"
    assert "Apple-silicon GPU through MPS (torch may allocate 12.0 GiB)" in doctor.format_report(facts)
    fake_machine(monkeypatch, cuda=False, mps=False)
    assert inventory.mps_info()["available"] is False


def test_ddp_workers_asked_for_mps_train_on_the_cpu(monkeypatch, capsys):
    from course_lib.engine import distributed

    fake_machine(monkeypatch, cuda=False, mps=True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    backends = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend: backends.append(backend))
    state, device = distributed.setup_distributed(make_config("auto"))
    assert device == torch.device("cpu") and backends == ["gloo"] and state.world_size == 2
    assert "no NCCL for Apple GPUs" in capsys.readouterr().out


def test_recommended_num_workers_is_one_rule():
    assert devices.recommended_num_workers(1, cores=32) == 16  # half the physical cores
    assert devices.recommended_num_workers(4, cores=32) == 4  # shared by four GPU processes
    assert devices.recommended_num_workers(0, cores=1) == 1
    assert devices.resolve_num_workers(-1) == devices.recommended_num_workers()  # Config's "auto"
    assert devices.resolve_num_workers(3) == 3
    physical, logical = devices.machine_cores()
    assert 1 <= devices.physical_cores() <= physical <= logical
