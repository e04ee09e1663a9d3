"""DDP measured (`engine.ddp`): DistributedSampler shards, the scaling table's formulas, and real
torchrun launches on CPU with gloo (DDP == 1-worker training, the scaling probe)."""
import pandas as pd
import pytest

from course_lib.config import ConfigError
from course_lib.engine import ddp

# --- DistributedSampler shards ------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_shards_are_disjoint_and_cover_the_data_when_the_count_divides(world_size):
    report = ddp.shard_report(24, world_size)
    assert report["disjoint"] and report["covers_all"]
    assert report["per_rank"] == 24 // world_size
    assert report["repeated"] == report["left_out"] == 0


def test_uneven_count_pads_by_repeating_or_drops_the_tail():
    padded = ddp.shard_report(10, 4, drop_last=False)
    assert padded["covers_all"] and not padded["disjoint"] and padded["repeated"] == 2  # 12 slots for 10 images
    dropped = ddp.shard_report(10, 4, drop_last=True)
    assert dropped["disjoint"] and not dropped["covers_all"] and dropped["left_out"] == 2


def test_set_epoch_changes_the_order_and_each_epoch_still_covers_the_data():
    first, second = ddp.sampler_shards(32, 2, epoch=0), ddp.sampler_shards(32, 2, epoch=1)
    assert first[0] != second[0]
    assert ddp.sampler_shards(32, 2, epoch=0) == first  # the order depends only on (seed, epoch)
    assert sorted(second[0] + second[1]) == list(range(32))
    assert ddp.shard_report(32, 2, epochs=3)["order_changes_with_epoch"]


# --- scaling formulas and the articles' rules -----------------------------------------------------

def fake_rows(t1_strong=1.0, t2_strong=0.6, t1_weak=0.5, t2_weak=0.55):
    return [
        {"mode": "strong", "workers": 1, "per_worker_batch": 64, "global_batch": 64, "step_seconds": t1_strong},
        {"mode": "weak", "workers": 1, "per_worker_batch": 32, "global_batch": 32, "step_seconds": t1_weak},
        {"mode": "strong", "workers": 2, "per_worker_batch": 32, "global_batch": 64, "step_seconds": t2_strong},
        {"mode": "weak", "workers": 2, "per_worker_batch": 32, "global_batch": 64, "step_seconds": t2_weak},
    ]


def test_scaling_table_efficiency_is_t1_over_n_times_tn():
    table = ddp.scaling_table(fake_rows(), epoch_images=640)
    strong = table[table["mode"] == "strong"].set_index("workers")
    assert strong.loc[1, "epoch_seconds"] == pytest.approx(10.0)  # 640 images / 64 per 1.0 s
    assert strong.loc[2, "efficiency"] == pytest.approx(1.0 / (2 * 0.6))
    assert strong.loc[2, "speedup"] == pytest.approx(1.0 / 0.6)
    weak = table[table["mode"] == "weak"].set_index("workers")
    # Throughput form: (64 / 0.55) / (2 x 32 / 0.5)
    assert weak.loc[2, "efficiency"] == pytest.approx((64 / 0.55) / (2 * 32 / 0.5))
    with pytest.raises(ConfigError, match="1-worker"):
        ddp.scaling_table([r for r in fake_rows() if r["workers"] == 2], epoch_images=640)


# --- real torchrun launches (CPU, gloo) -----------------------------------------------------------

@pytest.mark.torchrun
def test_two_worker_ddp_equals_one_worker_training_on_gloo():
    result = ddp.check_equivalence(2, {"batch_size": 8}, "smoke", steps=3, echo=None, timeout=120)
    assert result["equal"], result["max_abs_difference"]
    assert result["weights_moved"] > 100 * result["tolerance"]  # training really changed the weights


@pytest.mark.torchrun
def test_scaling_probe_measures_every_worker_count_and_the_all_reduce():
    report = ddp.measure_scaling(2, {"model": "test_resnet", "image_size": 16, "batch_size": 4}, "smoke", steps=1,
                                 warmup=1, profile_steps=1, epoch_images=64, echo=None, timeout=180)
    assert sorted(report.table["workers"].unique()) == [1, 2]
    assert set(report.table["mode"]) == {"strong", "weak"}
    assert (report.table["step_seconds"] > 0).all()
    assert report.communication["event_names"] == ["gloo:all_reduce"]
    assert 0 <= report.communication["exposed_share"] < 1 and report.communication["profiled_share"] > 0
    assert isinstance(report.table, pd.DataFrame)
