"""The chapter behind notebook 02: claims from small fake measurements (no GPU, no EuroSAT)."""
import pytest

from course_lib.analysis import claims
from course_lib.chapters import data_pipeline

DEFAULT, TUNED = data_pipeline.DEFAULT_LOADER, "tuned: workers=4"


def decode_rows(opencv_rates, pil_rates):
    rows = []
    for name, rates in (("pil", pil_rates), ("opencv", opencv_rates)):
        rows.append({"inputs": "eurosat files", "decoder": name, "image_size": 64, "images": 32, "repeats": len(rates),
                     "images_per_second": sorted(rates)[len(rates) // 2], "images_per_second_repeats": rates,
                     "speedup_vs_pil": 1.0})
    return rows


def training_rows(default_rate, tuned_rate, default_wait=0.6):
    rows = []
    for repeat, jitter in enumerate((0.98, 1.0, 1.02)):
        rows.append({"loader": DEFAULT, "repeat": repeat, "num_workers": 0, "images_per_second": default_rate * jitter,
                     "data_wait_fraction": default_wait + 0.01 * repeat, "compute_images_per_second": 1000.0 * jitter})
        rows.append({"loader": TUNED, "repeat": repeat, "num_workers": 4, "images_per_second": tuned_rate * jitter,
                     "data_wait_fraction": 0.05, "compute_images_per_second": 1600.0 * jitter})
    return rows


RAW = {"cold": True, "loose_files_per_second": 300.0, "shards_files_per_second": 2400.0,
       "loose_files_per_second_repeats": [290.0, 300.0, 310.0], "shards_files_per_second_repeats": [2350.0, 2400.0, 2450.0]}
PROBE = {"device": "nvme0n1", "kind": "nvme", "rotational": False, "model": "fake", "file_bytes": 2**20, "repeats": 2,
         "sequential_mb_per_s": [2000.0, 2100.0], "random_reads_per_s": [90000.0, 95000.0],
         "random_mb_per_s": [360.0, 380.0], "cache_dropped": True}


def all_claims(device_name="cpu", pin_rows=None):
    return data_pipeline.claims(decode_rows([200.0, 210.0, 205.0], [100.0, 101.0, 99.0]), RAW,
                                {"num_workers": 8, "setting": "workers=8"}, 32, 0.8, training_rows(100.0, 300.0),
                                100.0, PROBE, pin_rows, "resnet50", device_name, cache=(3.0, 2.5), augment_speedup=1.4)


def test_claims_on_a_cpu_have_every_key_and_verdict(monkeypatch):
    monkeypatch.setattr(claims, "_hardware", lambda: "fake machine")
    found = {c.key: c for c in all_claims()}
    assert list(found) == ["gpu_starved_utilisation", "cpu_cores_per_gpu", "nvme_vs_sata", "dataloader_tuning",
                           "num_workers_knee", "pin_memory", "opencv_decode", "tar_shards", "predecoded_cache",
                           "device_augmentation"]
    assert found["opencv_decode"].verdict == claims.HOLDS and found["opencv_decode"].measured == pytest.approx(2.05, 0.01)
    assert found["tar_shards"].verdict == claims.HOLDS and found["tar_shards"].measured == pytest.approx(8.0)
    assert found["dataloader_tuning"].verdict == claims.HOLDS and found["dataloader_tuning"].measured == pytest.approx(3.0)
    assert found["num_workers_knee"].measured == pytest.approx(0.25) and found["num_workers_knee"].verdict == claims.HOLDS
    assert found["gpu_starved_utilisation"].measured == pytest.approx(39.0)
    for key in ("pin_memory", "cpu_cores_per_gpu", "nvme_vs_sata"):
        assert found[key].verdict == claims.NOT_MEASURABLE
    assert "nvme0n1" in found["nvme_vs_sata"].reason and "IOPS" in found["nvme_vs_sata"].reason
    assert "100 images/s" in found["cpu_cores_per_gpu"].reason
    assert found["predecoded_cache"].verdict == found["device_augmentation"].verdict == claims.HOLDS


def test_claims_on_a_gpu_measure_pinning_and_cores(monkeypatch):
    monkeypatch.setattr(claims, "_hardware", lambda: "fake gpu")
    pin_rows = [{"pin_memory": False, "setting": "workers=4 pin=0", "repeats": 3, "images_per_second_repeats": [100.0, 101.0, 99.0]},
                {"pin_memory": True, "setting": "workers=4 pin=1", "repeats": 3, "images_per_second_repeats": [110.0, 111.0, 109.0]}]
    found = {c.key: c for c in all_claims("cuda:0", pin_rows)}
    assert found["pin_memory"].measured == pytest.approx(10.0) and found["pin_memory"].verdict == claims.HOLDS
    # 1600 images/s of compute over 100 images/s per core: 16 cores
    assert found["cpu_cores_per_gpu"].measured == pytest.approx(16.0) and found["cpu_cores_per_gpu"].verdict == claims.HOLDS


def test_a_slow_tuned_loader_does_not_hold():
    claim = data_pipeline.tuning_claim(training_rows(100.0, 105.0))
    assert claim.verdict == claims.REFUTED


def test_training_rate_table_one_row_per_loader():
    table = data_pipeline.training_rate_table(training_rows(100.0, 300.0))
    assert list(table.index) == [DEFAULT, TUNED]
    assert table.loc[TUNED, "repeats"] == 3 and table.loc[TUNED, "images_per_second"] == pytest.approx(300.0)


def test_setup_takes_the_measurement_sizes_from_the_profile_unless_told(monkeypatch):
    import torch

    from course_lib import devices

    monkeypatch.setattr(devices, "usable_cores", lambda: 6)
    threads = torch.get_num_threads()
    try:
        smoke = data_pipeline.setup("smoke", image_size=32)
        assert torch.get_num_threads() == 1  # torch_threads=1: the in-process loaders keep to one core
    finally:
        torch.set_num_threads(threads)
    assert smoke.config.image_size == 32 and smoke.data.line.startswith("data: ")
    assert (smoke.sweep_workers, smoke.decode_sizes, smoke.epochs) == ([0, 1], [256], 1)
    assert smoke.generated_count(256) == 8 and smoke.flops_per_image > 0 and smoke.cores == 6
    assert smoke.run_on == (smoke.device or torch.device("cpu")) and smoke.line().startswith("profile smoke: ")
    told = data_pipeline.setup("smoke", image_size=32, sweep_workers=[0, 3], decode_sizes=[128], torch_threads=0)
    assert (told.sweep_workers, told.decode_sizes) == ([0, 3], [128])
    assert data_pipeline.PIPELINE_CHOICES["cpu"]["generated_images"] == 0  # cpu: bench.images_for_size per size
