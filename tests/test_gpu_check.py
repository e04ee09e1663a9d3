"""`workbook gpu-check` without a GPU: the no-CUDA line, the budgets and failure handling of the
parts, each part's function on the CPU at tiny sizes, the datasheet lookup, and the report writer."""
import datetime
import functools
import json
import time
import types
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from course_lib import cli, paths
from course_lib.measure import gpu_check, inventory, peak

TINY = dict(model_name="test_resnet", image_size=32, num_classes=10, device="cpu")


def fake_cuda(monkeypatch, name="NVIDIA H100 80GB HBM3", count=1):
    monkeypatch.setattr(torch.cuda, "is_available", functools.lru_cache(lambda: True))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_without_cuda_the_check_is_one_line_and_exit_0(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", functools.lru_cache(lambda: False))
    assert cli.main(["gpu-check"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "nothing to check" in out[0]


def test_an_unknown_part_is_one_line(capsys):
    assert cli.main(["gpu-check", "--parts", "precision,warp"]) == 2
    assert "'warp' is not one of doctor, decode" in capsys.readouterr().err


def test_the_script_is_a_thin_wrapper_of_the_command():
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert '-m course_lib gpu-check "$@"' in script
    assert (ROOT / "scripts" / "gpu_check.sh").stat().st_mode & 0o111


def test_the_budgets_fit_eight_minutes():
    assert sum(gpu_check.BUDGETS.values()) + gpu_check.REPORT_RESERVE_SECONDS <= gpu_check.TOTAL_BUDGET_SECONDS == 480
    assert [part.name for part in gpu_check.default_parts()] == list(gpu_check.BUDGETS)


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"), ("nvidia  h200", "H200 SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100 80GB PCIe", "A100"), ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA L40", "L40"), ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"), ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Matrox G200", None), ("NVIDIA H200 NVL (prototype)", None)])
def test_the_datasheet_is_looked_up_by_exact_name(name, key):
    assert peak.datasheet_entry(name) == key
    facts = inventory.datasheet_facts(name)
    assert facts["datasheet"] == key and (facts["datasheet_tflops"] == peak.DATASHEET_TFLOPS[key] if key else
                                          facts["datasheet_tflops"] == {})


def test_datasheet_peaks_are_dense_and_every_name_has_a_row():
    assert set(peak.DEVICE_NAMES.values()) <= set(peak.DATASHEET_TFLOPS)
    # The 2:4-sparse figures the datasheets print first are exactly twice these (H100 SXM bf16: 1979).
    assert peak.DATASHEET_TFLOPS["H100 SXM"]["bf16"] == pytest.approx(1979 / 2, abs=0.5)
    assert peak.DATASHEET_TFLOPS["H200 NVL"]["bf16"] == pytest.approx(1671 / 2, abs=0.5)
    assert peak.DATASHEET_TFLOPS["H100 PCIe"]["tf32"] == pytest.approx(756 / 2, abs=0.5)


def test_datasheet_values_on_a_faked_gpu(monkeypatch):
    assert peak.datasheet_tflops("NVIDIA A100-SXM4-40GB", torch.bfloat16) == 312.0
    assert peak.datasheet_tflops("Tesla V100-PCIE-16GB", "bf16") is None  # Volta has no bf16 tensor cores
    fake_cuda(monkeypatch, "NVIDIA H200")
    assert peak.peak_flops("cuda:0", torch.bfloat16) == pytest.approx(989.4e12)
    assert peak.peak_flops_source("cuda:0", "tf32") == "datasheet (H200 SXM, dense)"


def _part(name, run, budget=5.0, skip=None):
    return gpu_check.Part(name, run, budget, (lambda: skip))


@pytest.mark.slow
def test_a_failing_or_overrunning_part_is_recorded_and_the_rest_still_run(monkeypatch):
    monkeypatch.setattr(gpu_check, "REPORT_RESERVE_SECONDS", 0)

    def fails(budget):
        raise ValueError("boom\nsecond line")

    def overruns(budget):
        while True:
            time.sleep(0.01)

    lines = []
    results = gpu_check.run_parts([_part("fails", fails), _part("slow", overruns, budget=0.3),
                                   _part("skipped", fails, skip="needs 2 GPUs"), _part("ok", lambda b: {"summary": {"b": b}})],
                                  total_budget_seconds=60, echo=lambda *a, **k: lines.append(a[0]))
    by_name = {r.name: r for r in results}
    assert by_name["fails"].status == "failed" and by_name["fails"].error == "ValueError: boom"
    assert "Traceback" in by_name["fails"].traceback
    assert by_name["slow"].status == "failed" and "ran past its budget of 0 s" in by_name["slow"].error
    assert by_name["slow"].seconds < 2
    assert by_name["skipped"].status == "skipped" and by_name["skipped"].error == "needs 2 GPUs"
    assert by_name["ok"].status == "ok" and by_name["ok"].result == {"summary": {"b": 5.0}}
    assert any("fails failed" in line for line in lines)


@pytest.mark.slow
def test_parts_share_the_total_budget(monkeypatch):
    monkeypatch.setattr(gpu_check, "REPORT_RESERVE_SECONDS", 0)
    now = [0.0]  # a fake clock: the first part "takes" 95 of the 100 seconds
    monkeypatch.setattr(gpu_check, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def slow(budget):
        now[0] += 95
        return {"budget": budget}

    results = gpu_check.run_parts([_part("first", slow, budget=200), _part("second", lambda b: {"budget": b}, budget=200),
                                   _part("late", lambda b: {"budget": b})], total_budget_seconds=100.5,
                                  echo=lambda *a, **k: None)
    assert results[0].result["budget"] == 100.5  # capped by the total
    assert results[1].result["budget"] == pytest.approx(5.5)  # what is left of it
    assert results[2].status == "ok"
    now[0] = 1000
    late = gpu_check.run_parts([_part("late", slow)], total_budget_seconds=0.5, echo=lambda *a, **k: None)
    assert late[0].status == "skipped" and late[0].error == "no time left in the total budget"


@pytest.fixture(scope="module")
def tiny_results():
    """The precision and memory parts run once, for real, on the CPU at tiny sizes (shared by the
    tests below: fp16/bf16 are emulated on most CPUs, and each peak-memory reading starts the profiler)."""
    return {"precision": gpu_check.precision_part(batch_size=4, steps=1, warmup=0, compile_model=False, **TINY),
            "memory": gpu_check.memory_part(batch_sizes=(2, 4, 8), precision="off", max_batch=16, **TINY)}


@pytest.mark.slow
def test_precision_part_on_cpu_compares_the_variants(tiny_results):
    result = tiny_results["precision"]
    rows = {row["variant"]: row for row in result["rows"]}
    assert list(rows) == ["fp32", "fp16 + GradScaler", "bf16", "bf16 + channels_last"]
    for row in rows.values():
        assert row["images_per_second"] > 0 and row["peak_memory_bytes"] > 0 and 0 < row["mfu"]
        assert row["flops_per_image"] == rows["fp32"]["flops_per_image"]  # counted once, reused
    assert rows["fp32"]["speedup_vs_fp32"] == 1.0 and rows["fp32"]["mfu_dtype"] == "fp32"
    assert rows["bf16 + channels_last"]["channels_last"] is True
    assert result["summary"]["best_variant"] in rows


def test_precision_part_stops_at_its_budget():
    result = gpu_check.precision_part(0.0, batch_size=2, steps=1, warmup=0, compile_model=False, **TINY)
    assert all(row["error"].startswith("skipped") for row in result["rows"])


def test_memory_part_on_cpu_compares_the_estimate_with_the_measured_peak(tiny_results):
    result = tiny_results["memory"]
    assert [row["batch_size"] for row in result["rows"]] == [2, 4, 8]
    assert all(row["measured_peak_bytes"] > 0 and row["estimated_bytes"] > 0 for row in result["rows"])
    assert result["summary"]["largest_batch"] == 16  # nothing runs out at this size on the CPU


class FakeProbe:
    """A training step whose peak grows by 1000 bytes per image."""

    def __init__(self, *args, **kwargs):
        self.precision = "off"

    def estimate(self, batch):
        return None

    def peak_bytes(self, batch):
        return 1000 * batch


def test_the_batch_search_stops_at_a_cap_or_at_its_budget(monkeypatch):
    monkeypatch.setattr(gpu_check.memory_probe, "compare_estimate_and_peak", lambda *a, **k: [])
    monkeypatch.setattr(gpu_check.memory_probe, "TrainingStepProbe", FakeProbe)
    capped = gpu_check.memory_part(batch_sizes=(8,), max_batch=64, memory_cap_bytes=20_500, **TINY)
    assert capped["summary"]["largest_batch"] == 16  # 24 is over the cap
    assert any(trial["reason"] == "over memory cap" for trial in capped["trials"])
    stopped = gpu_check.memory_part(0.0, batch_sizes=(8,), max_batch=64, **TINY)
    assert stopped["summary"]["largest_batch"] is None
    assert stopped["summary"]["search_note"] == "the out-of-memory search ran out of its budget"


def test_decode_part_on_cpu_names_what_it_skipped():
    result = gpu_check.decode_part(sizes="32", repeats=1, images=4)
    assert "pil" in result["summary"]["decoders"] and "nvjpeg" not in result["summary"]["decoders"]
    assert result["notes"] == ["nvJPEG needs a CUDA GPU"]
    assert all(row["images_per_second"] > 0 for row in result["rows"])


def test_speedrun_and_ddp_say_why_they_skip(monkeypatch):
    monkeypatch.setenv(paths.DATA_ENV, "none")  # hides every real dataset from paths.eurosat_dir
    assert "EuroSAT" in gpu_check.speedrun_skip_reason()
    fake_cuda(monkeypatch, count=1)
    assert gpu_check.ddp_skip_reason() == "DDP scaling needs 2 or more GPUs; torch sees 1"
    fake_cuda(monkeypatch, count=4)
    assert gpu_check.ddp_skip_reason() is None


@pytest.mark.slow
def test_the_report_is_json_and_markdown_in_a_folder_per_gpu_and_day(tmp_path, monkeypatch, tiny_results):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    parts = [_part("precision", lambda b: tiny_results["precision"]), _part("memory", lambda b: tiny_results["memory"]),
             _part("decode", lambda b: 1 / 0), _part("ddp", None, skip="needs 2 GPUs")]
    monkeypatch.setattr(gpu_check, "REPORT_RESERVE_SECONDS", 0)
    folder = gpu_check.run_check(parts, out_root=tmp_path, total_budget_seconds=60, echo=lambda *a, **k: None)
    assert folder == tmp_path / f"nvidia-h100-80gb-hbm3-{datetime.date.today().isoformat()}"
    report = json.loads((folder / "gpu_check.json").read_text())
    assert [p["status"] for p in report["parts"]] == ["ok", "ok", "failed", "skipped"]
    assert report["parts"][2]["error"] == "ZeroDivisionError: division by zero"
    text = (folder / "README.md").read_text()
    assert text.startswith("# gpu-check on NVIDIA H100 80GB HBM3")
    assert "| fp32 |" in text and "| bf16 + channels_last |" in text and "Largest batch that trains" in text
    assert "| 8 |" in text  # a memory row
    assert "- **decode**: ZeroDivisionError: division by zero" in text
    again = gpu_check.results_folder("NVIDIA H100 80GB HBM3", datetime.date.today(), tmp_path)
    assert again.name.endswith("-2")  # a second run the same day keeps the first


def test_slug():
    assert gpu_check.slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    assert gpu_check.slug("???") == "unknown-gpu"


def test_results_folder_defaults_to_docs_results():
    folder = gpu_check.results_folder("NVIDIA L4", datetime.date(2026, 1, 2))
    assert folder.parent == Path(paths.project_root()) / "docs" / "results" and folder.name.startswith("nvidia-l4-2026-01-02")


def test_a_failed_variant_row_keeps_the_table_shape():
    rows = [{"variant": "fp32", "a": 1.0}, {"variant": "fp8", "error": "not supported"}]
    lines = gpu_check._table_rows(rows, 3, lambda row: [row["variant"], f"{row['a']:.1f}", "x"])
    assert lines == ["| fp32 | 1.0 | x |", "| fp8 | not supported | |"]
    assert all(line.count("|") == 4 for line in lines)
