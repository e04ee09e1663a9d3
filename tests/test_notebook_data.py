"""Every notebook that picks its data does it through a chapter function; here each runs for the cpu
and gpu profiles with real data hidden (WORKBOOK_DATA=none), at tiny image sizes, and the sizes it
chose must fit the synthetic data it fell back to: what a fresh clone without ../shared meets."""
import nbformat
import numpy as np
import pytest
from conftest import ROOT

from course_lib import paths
from course_lib.chapters import (casestudy, compress_and_deploy, confusion_study, data_pipeline, data_quality,
                                 ddp_scaling, regularization_study, setup_check, time_to_accuracy, transfer_plans)
from course_lib.config import ConfigError
from course_lib.data import cache, class_split, datasets, landcover, pipeline, shards

PROFILES = ("cpu", "gpu")


@pytest.fixture
def no_real_data(monkeypatch, tmp_path_factory):
    """Real data hidden; generated landcover-synth, pre-decoded caches and shards under one temporary
    project for the whole session (generated once), never in the project's data_cache/."""
    monkeypatch.setenv(paths.DATA_ENV, "none")
    root = tmp_path_factory.getbasetemp() / "no-real-data-project"
    root.mkdir(exist_ok=True)
    for module in (landcover, cache, shards, pipeline):
        monkeypatch.setattr(module, "project_root", lambda: root)
    return root


def _setup_cell(stem: str) -> str:
    notebook = nbformat.read(str(next((ROOT / "notebooks").glob(f"{stem}_*.ipynb"))), as_version=4)
    return "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.parametrize("stem, call", [
    ("00", "setup_check.setup("), ("02", "data_pipeline.setup("), ("03", "mixed_precision.setup("),
    ("04", "gradient_accumulation.setup("), ("05", "ddp_scaling.setup("), ("06", "optimizer_study.setup("),
    ("07", "regularization_study.setup("), ("08", "transfer_plans.setup("),
    ("09", "confusion_study.setup("), ("10", "casestudy.setup("), ("11", "troubleshoot.setup("),
    ("12", "time_to_accuracy.setup("), ("13", "study.setup("),
    ("14", "profiling.setup("), ("15", "data_quality.setup(")])
def test_each_notebook_chooses_its_data_through_the_function_tested_here_and_prints_its_line(stem, call):
    code = _setup_cell(stem)
    assert call in code, f"notebook {stem} no longer calls {call}: the tests below would not cover its data choice"
    assert ".line)" in code.split(call, 1)[1].split("\n\n", 1)[0] or "data.line)" in code \
        or "print(setup.data.line," in code, \
        f"notebook {stem} does not print the data line"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.slow
def test_00_shows_the_synthetic_data_it_fell_back_to(no_real_data, profile):
    setup = setup_check.setup(profile, image_size=32)
    assert setup.data.synthetic and setup.config.dataset == "landcover-synth"
    sizes = setup.split_sizes()
    assert sizes["train"] > 0 and sizes["val"] >= len(setup.bundle.classes)  # a sample grid row per class


@pytest.mark.parametrize("profile", PROFILES)
def test_02_times_no_more_images_than_the_folder_holds(no_real_data, profile):
    setup = data_pipeline.setup(profile, image_size=32, torch_threads=0)
    assert setup.data.synthetic and "workbook data get eurosat" in setup.data.line
    assert 0 < setup.images <= len(datasets.ImageFolderDataset(setup.folder))
    cores = setup.cores  # the loader sweep: from none to twice the cores
    assert setup.sweep_workers == sorted({0, 1, 2, max(1, cores // 2), cores, 2 * cores}) and setup.epochs == 2


@pytest.mark.parametrize("profile", PROFILES)
def test_05_every_worker_gets_a_batch_of_the_profiles_own_data(no_real_data, profile):
    setup = ddp_scaling.setup(profile, image_size=32)
    assert setup.data.synthetic and setup.config.dataset == "landcover-synth"
    assert setup.train_images >= setup.workers * setup.config.batch_size


@pytest.mark.parametrize("profile", ["smoke", "cpu"])  # gpu: its setup trains on the GPU it asks for
def test_03_every_compared_run_has_two_epochs_of_a_few_steps(no_real_data, profile):
    from course_lib.chapters import mixed_precision

    setup = mixed_precision.setup(profile)
    assert setup.data.synthetic and setup.config.epochs >= 2
    assert setup.config.max_steps == (2 if profile == "smoke" else 6) and setup.seeds >= 2
    assert setup.measure_compile is (profile != "smoke")
    assert setup.accuracy_config is setup.config and setup.accuracy_data is None  # the same short runs, over seeds
    # Section 2's runs are the comparison's seed 0: taken over, not trained again.
    runs = {"off": "fp32 run", "bf16": "bf16 run"}
    assert setup.reused(runs) == {("off", setup.config.seed): "fp32 run", ("bf16", setup.config.seed): "bf16 run"}
    assert setup.config.seed == 0  # the notebook's seeds are range(seeds)


def test_03_reference_compares_precisions_on_the_speedrun_recipe(no_real_data):
    """The reference profile's accuracy comparison trains the speed-run recipe (issue 51), single view, 5 seeds;
    its step timing keeps the cpu pass's sizes."""
    from course_lib.chapters import mixed_precision

    setup = mixed_precision.setup("reference")
    cpu = mixed_precision.setup("cpu")
    accurate = setup.accuracy_config
    assert setup.seeds == 5 and setup.config.max_steps == cpu.config.max_steps == 6
    assert accurate.recipe == "speedrun" and accurate.model == "speedrun_resnet_small" and accurate.epochs == 21
    assert accurate.tta_views == 1 and accurate.max_steps == 0 and accurate.max_train_images == 0
    assert "accuracy comparison: the speedrun recipe" in setup.line() and setup.accuracy_data.line in setup.line()
    assert setup.reused({"off": "a short run of another config"}) == {}  # the recipe trains every seed itself


@pytest.mark.parametrize("profile", ["smoke", "cpu"])  # gpu: its setup trains on the GPU it asks for
def test_04_the_big_batch_is_staged_for_the_model(no_real_data, profile):
    from course_lib.chapters import gradient_accumulation

    setup = gradient_accumulation.setup(profile, image_size=32, batch_size=8)
    assert setup.data.synthetic and setup.images.dtype.is_floating_point and len(setup.images) == 8
    assert setup.config.precision == "off" and setup.config.max_steps == 3


@pytest.mark.parametrize("profile", ["smoke", "cpu"])  # gpu: its setup trains on the GPU it asks for
def test_11_makes_its_problems_on_the_cpu_transforms(no_real_data, profile):
    import shutil

    from course_lib.chapters import troubleshoot

    setup = troubleshoot.setup(profile, image_size=32)
    try:
        assert setup.data.synthetic and setup.config.augmentation == "cpu" and setup.scratch.is_dir()
        assert setup.config.max_steps == (4 if profile == "smoke" else 12) and len(setup.bundle.train) > 0
    finally:
        shutil.rmtree(setup.scratch, ignore_errors=True)


@pytest.mark.parametrize("profile", ["smoke", "cpu"])  # gpu: its setup profiles the GPU it asks for
def test_14_profiles_a_few_steps_of_the_profiles_data(no_real_data, profile):
    from course_lib.chapters import profiling

    setup = profiling.setup(profile, image_size=32)
    assert setup.data.synthetic and setup.config.epochs == 1
    assert setup.config.max_steps == (4 if profile == "smoke" else 10) and setup.monitor_interval == 0.1


@pytest.mark.parametrize("profile", PROFILES)
def test_06_the_grid_and_its_seeds_fit_the_synthetic_data(no_real_data, profile):
    from course_lib.chapters import optimizer_study

    setup = optimizer_study.setup(profile, image_size=32)
    assert setup.data.synthetic and setup.steps_per_epoch >= 1 and len(setup.seeds) >= 2
    assert setup.grid_config.storage == "cache" and setup.grid_config.image_size <= 64
    assert len(setup.grid_factors) >= 2 and setup.range_test_steps >= 12


@pytest.mark.parametrize("profile", PROFILES)
def test_07_every_epoch_has_steps_on_the_synthetic_data(no_real_data, profile):
    setup = regularization_study.setup(profile, image_size=32)
    assert setup.data.synthetic and setup.config.dataset == "landcover-synth"
    assert setup.steps_per_epoch >= 1 and len(setup.bundle.val) > 0
    regularization_study.ema_decay_for(setup.steps_per_epoch * setup.config.epochs)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.slow
def test_08_source_and_label_counts_fit_the_smallest_class(no_real_data, profile):
    setup = transfer_plans.setup(profile, image_size=32)
    assert setup.plan.synthetic and setup.data.synthetic
    # What the notebook's cells cut from the whole dataset: the source, then every target run.
    class_split.subset_bundle(setup.bundle, setup.source_classes, per_class=setup.source_per_class, val_per_class=200,
                              parameter="source_per_class")
    for labels in setup.labels_per_class:
        target = class_split.subset_bundle(setup.bundle, setup.held_out, per_class=labels, seed=setup.seeds[-1],
                                           val_per_class=100, parameter="labels_per_class")
        assert len(target.train) == labels * len(setup.held_out)
    with pytest.raises(ConfigError, match=r"^source_per_class=100000 asks for more .*; "
                                          r"set -p source_per_class=N with N <= \d+$"):
        transfer_plans.setup(profile, image_size=32, source_per_class=100_000)
    with pytest.raises(ConfigError, match=r"^labels_per_class=100000 .* set -p labels_per_class=N with N <= \d+$"):
        transfer_plans.setup(profile, image_size=32, labels_per_class=[10, 100_000])


def test_08_smoke_stays_on_the_committed_sample_where_real_data_lies_beside_the_project(monkeypatch):
    """The smoke profile's promise (`paths.choose_data`): CI-sized runs use the committed sample even where
    real data is found; notebook 08's plan once looked for real data itself when handed the sample."""
    sample = ROOT / paths.SAMPLE_DIR
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    monkeypatch.setattr(paths, "find_real_data", lambda: paths.DataChoice(
        {"dataset": "imagefolder", "data_dir": str(sample)}, "real-looking", "a test's stand-in", False, sample))
    setup = transfer_plans.setup("smoke", image_size=32)
    assert setup.data.synthetic and setup.plan.synthetic
    assert setup.plan.target == "landcover-synth" and setup.plan.data_config.dataset == "landcover-synth"


@pytest.mark.parametrize("profile", PROFILES)
def test_09_trains_on_the_synthetic_data(no_real_data, profile):
    setup = confusion_study.setup(profile, image_size=32)
    config, bundle = setup.config, setup.bundle
    assert setup.data.synthetic and config.dataset == "landcover-synth"
    assert len(bundle.train) >= config.batch_size and bundle.test is not None and len(bundle.val) > 0


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.slow
def test_10_generates_its_landcover_synth_and_trains_on_it(no_real_data, profile):
    setup = casestudy.setup(profile, source_image_size=32, image_size=32)
    config, bundle = setup.config, setup.bundle
    assert setup.data.synthetic and "landcover-synth-32px" in config.data_dir
    assert len(bundle.train) >= config.batch_size and len(bundle.val) > 0
    assert len(setup.noise_seeds) >= 1 and (setup.ddp_processes == 0) == (profile == "smoke" or profile == "gpu")
    assert "SYNTHETIC DATA" in setup.line().splitlines()[0]


@pytest.mark.parametrize("profile", PROFILES)
def test_12_racers_read_a_real_folder_the_naive_loop_can_open(no_real_data, profile):
    race = time_to_accuracy.setup(profile)
    assert race.data.synthetic
    for config in (race.recipe, race.default):  # the hand-written loop reads data_dir's train/ and val/ itself
        root = paths.resolve_path(config.data_dir)
        assert config.data_dir and (root / "train").is_dir()
        assert any((root / name).is_dir() for name in ("val", "valid"))
    short, validation = time_to_accuracy.ablation_config(race)
    bundle = pipeline.build_datasets(short.replace(storage="files", augmentation="cpu", num_workers=0))
    assert len(bundle.train) >= short.batch_size


@pytest.mark.parametrize("profile", PROFILES)
def test_13_every_study_has_images_to_train_and_score(no_real_data, profile):
    setup = compress_and_deploy.setup(profile, image_size=32)
    assert setup.data.synthetic
    bundle = setup.bundle
    assert len(bundle.train) >= setup.config.batch_size and len(bundle.val) >= len(bundle.classes)
    every_class = list(range(len(bundle.classes)))  # the continual study needs old and new classes to train on
    assert class_split.smallest_class(class_split.targets_of(bundle.train), every_class) >= 1


@pytest.mark.parametrize("profile", PROFILES)
def test_15_sizes_its_label_study_to_the_synthetic_data(no_real_data, profile):
    setup = data_quality.setup(profile, images=40, folds=2)
    assert setup.data.synthetic and "workbook data get eurosat" in setup.data.line
    counts = np.bincount(class_split.targets_of(setup.bundle.train))
    assert counts.min() >= setup.folds  # every fold holds every class
    assert len(setup.bundle.val) > 0 and setup.root.is_dir()
