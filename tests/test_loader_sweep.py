"""The DataLoader knob sweep (`measure/loader_sweep.py`): the knee, the grid, a real sweep, and the
decode-limit share."""
import pytest

from course_lib.config import make_config
from course_lib.data import loaders
from course_lib.data.landcover import make_landcover
from course_lib.measure import loader_sweep


def rows(table):
    return [{"num_workers": w, "prefetch_factor": p, "images_per_second": r} for w, p, r in table]


def test_knee_is_the_cheapest_setting_within_five_percent_of_the_best():
    table = rows([(0, 2, 100), (1, 2, 180), (2, 2, 290), (4, 2, 300), (8, 2, 298)])
    assert loader_sweep.find_knee(table)["num_workers"] == 2  # 290 >= 0.95 * 300
    assert loader_sweep.find_knee(table, tolerance=0.01)["num_workers"] == 4


def test_knee_prefers_less_prefetching_at_equal_workers_and_reaches_the_best():
    table = rows([(4, 8, 1000), (4, 2, 960), (2, 2, 700)])
    assert loader_sweep.find_knee(table)["prefetch_factor"] == 2
    assert loader_sweep.find_knee(rows([(0, 2, 50), (1, 2, 100)]))["num_workers"] == 1


def test_setting_grid_drops_knobs_that_do_nothing_without_workers():
    grid = loader_sweep.setting_grid((0, 2), (False,), (2, 4), (False, True))
    assert [s for s in grid if s.num_workers == 0] == [loader_sweep.LoaderSetting(0)]
    assert len(grid) == 1 + 2 * 2


def test_sweep_times_every_setting_on_the_real_pipeline(tmp_path):
    folder = make_landcover(tmp_path / "set", image_size=32, per_class={"train": 2}) / "train"
    (folder / "forest" / "forest_99999.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")  # skipped, as in a real folder
    dataset = loaders.first_images(loaders.image_folder_dataset(folder, 32, bad_images="skip"), 8)
    config = make_config("smoke", batch_size=4)
    settings = loader_sweep.setting_grid((0, 1))
    table = loader_sweep.sweep_loader(dataset, config, settings, epochs=1, warmup_epochs=0)
    assert [r["num_workers"] for r in table] == [0, 1]
    assert all(r["images"] == 8 and r["images_per_second"] > 0 for r in table)
    assert loader_sweep.find_knee(table) in table


def test_decode_limit_share_counts_the_cores_a_loader_uses():
    assert loader_sweep.cores_used(0, 8) == 1 and loader_sweep.cores_used(4, 8) == 4
    assert loader_sweep.cores_used(16, 8) == 8
    assert loader_sweep.decode_limit_share(400.0, 100.0, 4, 8) == pytest.approx(1.0)
    assert loader_sweep.decode_limit_share(50.0, 100.0, 0, 8) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        loader_sweep.decode_limit_share(1.0, 0.0, 1, 1)


def test_with_decode_share_adds_a_column_after_mfu():
    import pandas as pd

    table = pd.DataFrame({"num_workers": [0, 2], "images_per_second": [100.0, 300.0], "MFU": [0.1, 0.3]})
    shared = loader_sweep.with_decode_share(table, 100.0, cores=2)
    assert list(shared.columns) == ["num_workers", "images_per_second", "MFU", "share of decode limit"]
    assert shared["share of decode limit"].tolist() == pytest.approx([1.0, 1.5])


def test_cores_per_accelerator_and_setting_of():
    assert loader_sweep.cores_per_accelerator(3000.0, 200.0) == pytest.approx(15.0)
    setting = loader_sweep.setting_of({"num_workers": 0, "pin_memory": True, "setting": "x", "images_per_second": 1.0},
                                      min_workers=1)
    assert setting == loader_sweep.LoaderSetting(1, pin_memory=True)


def test_measure_data_wait_leaves_the_warm_up_batches_out(monkeypatch):
    clock = {"now": 0.0}
    monkeypatch.setattr(loaders, "now", lambda device=None: clock["now"])

    def step(batch):
        clock["now"] += 1.0  # seconds of compute per step

    def loader():
        for index in range(3):
            clock["now"] += 10.0 if index == 0 else 1.0  # the first batch waits for the workers to start
            yield index

    measured = loader_sweep.measure_data_wait(loader(), step, warmup_batches=1)
    assert measured.batches == 2 and measured.data_wait_fraction == pytest.approx(0.5)
