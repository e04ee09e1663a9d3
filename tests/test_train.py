"""The training engine: accumulation, resume exactness, checkpoint safety, the non-finite guard,
and a 2-process gloo run under torchrun. Tiny timm models on CPU."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import CrashAfter, TensorImages, tiny_config

from course_lib import ledger
from course_lib.config import ConfigError, make_config
from course_lib.data.datasets import DataBundle
from course_lib.data.pipeline import build_datasets
from course_lib.data.device_augment import DeviceStage
from course_lib.engine import train
from course_lib.models import checkpoint, factory
from course_lib.models.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
CLASSES = [f"class{i}" for i in range(4)]


def tensor_bundle(train_images=64, size=16):
    return DataBundle(TensorImages(train_images, size=size), TensorImages(16, size=size, seed=1), None, CLASSES,
                      "tensors")


def weights_of(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(first, second, atol=0.0):
    assert first.keys() == second.keys()
    for name in first:
        if first[name].is_floating_point():
            torch.testing.assert_close(first[name], second[name], rtol=0, atol=atol, msg=name)
        else:
            assert torch.equal(first[name], second[name]), name


# --- the engine runs and records --------------------------------------------------------------

def test_fit_returns_model_history_checkpoint_and_ledger_row(tmp_path):
    result = train.fit(tiny_config(tmp_path, epochs=2, ema_decay=0.9), bundle=tensor_bundle(), progress=False)
    assert len(result.history) == 2 and result.classes == CLASSES
    row = result.final
    for key in ("train_loss", "train_top1", "val_top1", "val_top5", "images_per_second", "data_wait_fraction",
                "peak_memory_bytes", "ema_val_top1", "world_size", "global_batch_size"):
        assert key in row, key
    assert 0.0 <= row["data_wait_fraction"] <= 1.0 and row["images_per_second"] > 0
    assert not result.model.training and result.ema_model is not None
    state = checkpoint.load_checkpoint(result.checkpoint_path)
    assert state["epoch"] == 2 and state["classes"] == CLASSES and state["config"]["model"] == "test_resnet"
    rebuilt = factory.model_from_checkpoint(result.checkpoint_path)
    assert_same_weights(weights_of(rebuilt), weights_of(result.model))
    rows = ledger.Ledger().rows(kind="train")
    assert rows[0]["status"] == "ok" and rows[0]["metrics"]["epochs_completed"] == 2
    assert rows[0]["metrics"]["val_images"] == len(tensor_bundle().val)  # what gives top-1 its interval


def test_channels_last_and_label_smoothing_and_mixup_run(tmp_path):
    config = tiny_config(tmp_path, channels_last=True, label_smoothing=0.1, mixup_alpha=0.2, cutmix_alpha=1.0,
                         random_erasing=0.25, grad_clip_norm=1.0, max_steps=2, optimizer="adamw", lr=1e-3)
    result = train.fit(config, bundle=tensor_bundle(), progress=False)
    assert torch.isfinite(torch.tensor(result.final["train_loss"]))


# --- the seams: prepare / train_one_epoch / validate ------------------------------------------------

def test_prepare_builds_the_regularizers_the_config_asks_for(tmp_path):
    from timm.data import Mixup
    from timm.data.random_erasing import RandomErasing
    from timm.loss import SoftTargetCrossEntropy
    from timm.utils import ModelEmaV3

    plain = train.prepare(tiny_config(tmp_path), tensor_bundle(), verbose=False)
    assert plain.mixup is None and plain.eraser is None and plain.ema is None
    assert isinstance(plain.criterion, torch.nn.CrossEntropyLoss) and plain.criterion.label_smoothing == 0.0
    config = tiny_config(tmp_path, mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=0.1, random_erasing=0.25,
                         ema_decay=0.99)
    regularized = train.prepare(config, tensor_bundle(), verbose=False)
    assert isinstance(regularized.mixup, Mixup) and regularized.mixup.label_smoothing == 0.1
    assert isinstance(regularized.criterion, SoftTargetCrossEntropy)
    assert isinstance(regularized.eraser, RandomErasing) and regularized.eraser.probability == 0.25
    assert isinstance(regularized.ema, ModelEmaV3) and regularized.ema.decay == 0.99
    smoothing_only = train.prepare(tiny_config(tmp_path, label_smoothing=0.2), tensor_bundle(), verbose=False)
    assert smoothing_only.criterion.label_smoothing == 0.2


def test_the_seams_by_hand_train_exactly_like_fit(tmp_path):
    config = tiny_config(tmp_path, epochs=2, max_steps=2, ema_decay=0.9)
    fitted = train.fit(config, bundle=tensor_bundle(), progress=False, verbose=False)
    state = train.prepare(config.replace(output_dir=str(tmp_path / "by_hand")), tensor_bundle(), verbose=False)
    for epoch in range(config.epochs):
        row = train.train_one_epoch(state, epoch, progress=False)
        scores = train.validate(state.model, state)
    assert_same_weights(weights_of(fitted.model), weights_of(state.raw_model))
    assert row["train_loss"] == fitted.final["train_loss"] and scores["top1"] == fitted.final["val_top1"]
    assert scores["images"] == 16 and state.global_step == 4 and len(state.step_log) == 4


class RecordingStage(DeviceStage):
    """The bundle's device stage, remembering the `train` flag of every call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __call__(self, images, device, *, train):
        self.calls.append(train)
        return super().__call__(images, device, train=train)


def test_batches_reach_the_device_through_the_bundles_stage(tmp_path):
    bundle = tensor_bundle()
    bundle.device_stage = RecordingStage()
    train.fit(tiny_config(tmp_path, max_steps=3, ema_decay=0.9, batch_size=8), bundle=bundle, progress=False,
              verbose=False)
    # 3 training batches, then 16 validation images in batches of 8, for the weights and for the EMA
    assert bundle.device_stage.calls == [True] * 3 + [False] * 4


def test_the_first_log_lines_name_the_data_pipeline_then_the_run(tmp_path, capsys):
    bundle = tensor_bundle()
    bundle.pipeline = "decoder pil, storage memory, augmentation device"
    train.fit(tiny_config(tmp_path, max_steps=1), bundle=bundle, progress=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "data: tensors, decoder pil, storage memory, augmentation device"
    assert lines[1].startswith("training test_resnet on 64 images (4 classes)")


# --- gradient accumulation (unit tests: test_accumulation.py) ---

def test_engine_accumulation_matches_big_batch_for_a_model_without_batchnorm(tmp_path):
    # test_nfnet is normalizer-free (no BatchNorm), so 2 x 16 accumulated == 1 x 32.
    common = dict(model="test_nfnet", max_steps=2, lr=0.05, weight_decay=0.0)
    big = train.fit(tiny_config(tmp_path / "big", batch_size=32, accumulation_steps=1, **common),
                    bundle=tensor_bundle(), progress=False, verbose=False)
    accumulated = train.fit(tiny_config(tmp_path / "acc", batch_size=16, accumulation_steps=2, **common),
                            bundle=tensor_bundle(), progress=False, verbose=False)
    assert_same_weights(weights_of(big.model), weights_of(accumulated.model), atol=1e-5)
    assert big.final["global_batch_size"] == accumulated.final["global_batch_size"] == 32


# --- resume ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_resume_after_a_mid_epoch_kill_ends_with_the_uninterrupted_weights(tmp_path):
    # Real images with random-crop/flip augmentation, so the random streams must line up too.
    config = make_config("smoke", model="test_resnet", batch_size=16, epochs=3, max_steps=3, max_train_images=64,
                         image_size=32, lr=0.05, warmup_epochs=1.0, ema_decay=0.9, precision="off",
                         output_dir=str(tmp_path / "uninterrupted"))
    full = build_datasets(config)
    bundle = DataBundle(full.train, torch.utils.data.Subset(full.val, range(16)), None, full.classes, "sample")
    uninterrupted = train.fit(config, bundle=bundle, progress=False, verbose=False)

    interrupted = config.replace(output_dir=str(tmp_path / "interrupted"))
    crashing = DataBundle(CrashAfter(bundle.train, limit=16 * 3 + 20), bundle.val, None, bundle.classes, "crash")
    with pytest.raises(KeyboardInterrupt):  # dies in epoch 2, step 2
        train.fit(interrupted, bundle=crashing, progress=False, verbose=False)
    assert load_checkpoint(tmp_path / "interrupted" / "last.pt")["epoch"] == 1
    resumed = train.fit(interrupted.replace(resume=True), bundle=bundle, progress=False, verbose=False)

    assert [row["epoch"] for row in resumed.history] == [1, 2, 3]
    assert_same_weights(weights_of(uninterrupted.model), weights_of(resumed.model))
    assert_same_weights(weights_of(uninterrupted.ema_model), weights_of(resumed.ema_model))


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path):
    train.fit(tiny_config(tmp_path, max_steps=1), bundle=tensor_bundle(), progress=False, verbose=False)
    with pytest.raises(ConfigError, match="same model"):
        train.fit(tiny_config(tmp_path, max_steps=1, model="test_nfnet", resume=True), bundle=tensor_bundle(),
                  progress=False, verbose=False)


@pytest.mark.parametrize("changes,expected", [
    ({"lr": 0.01, "optimizer": "adamw"}, "optimizer: sgd -> adamw; lr: 0.05 -> 0.01"),  # adamw gave KeyError: 'step'
    ({"backbone_lr_scale": 0.5}, "backbone_lr_scale: 1.0 -> 0.5"),
    ({"seed": 1, "label_smoothing": 0.1}, "label_smoothing: 0.0 -> 0.1; seed: 0 -> 1"),
])
def test_resume_refuses_changed_training_values_in_one_line(tmp_path, changes, expected):
    train.fit(tiny_config(tmp_path, max_steps=1), bundle=tensor_bundle(), progress=False, verbose=False)
    saved = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(ConfigError) as caught:
        train.fit(tiny_config(tmp_path, max_steps=1, epochs=2, resume=True, **changes), bundle=tensor_bundle(),
                  progress=False, verbose=False)
    message = str(caught.value)
    assert f"({expected})" in message and "another output_dir" in message and "\n" not in message
    assert "epochs" not in message.split("(")[1]  # epochs may change
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == saved


def test_resume_with_more_epochs_decays_to_min_lr_at_the_new_end(tmp_path, capsys):
    train.fit(tiny_config(tmp_path, max_steps=3), bundle=tensor_bundle(), progress=False, verbose=False)
    extended = train.fit(tiny_config(tmp_path, max_steps=3, epochs=2, resume=True, num_workers=1),
                         bundle=tensor_bundle(), progress=False)
    assert "resume: epochs 1 -> 2: the cosine decay now ends at epoch 2" in capsys.readouterr().out
    lrs = [row["lr"] for row in extended.step_log]
    assert len(lrs) == 3 and lrs == sorted(lrs, reverse=True)  # still decaying, no jump back up
    assert extended.final["lr"] == pytest.approx(0.0, abs=1e-12)  # min_lr at the new last step


def test_cli_refuses_a_resume_with_another_learning_rate_in_one_line(tmp_path, capsys):
    from course_lib import cli

    common = ["train", "--profile", "smoke", "--no-progress", "-p", "max_steps=1", "-p",
              f"output_dir={tmp_path / 'out'}"]
    assert cli.main(common) == 0
    capsys.readouterr()
    assert cli.main(common + ["-p", "resume=true", "-p", "lr=0.05"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "(lr: 0.1 -> 0.05)" in lines[0], lines


# --- the non-finite guard ----------------------------------------------------------------------

class PoisonAfter(TensorImages):
    """Returns NaN images from the `start`-th read on."""

    def __init__(self, count, start):
        super().__init__(count)
        self.start, self.reads = start, 0

    def __getitem__(self, index):
        self.reads += 1
        image, target = super().__getitem__(index)
        return (torch.full_like(image, float("nan")) if self.reads > self.start else image), target


def test_non_finite_guard_names_the_step_and_causes(tmp_path):
    bundle = DataBundle(PoisonAfter(128, start=16 * 2), TensorImages(16), None, CLASSES, "poison")
    with pytest.raises(train.NonFiniteLossError) as caught:
        train.fit(tiny_config(tmp_path), bundle=bundle, progress=False, verbose=False)
    message = str(caught.value)
    assert "step 3" in message and "learning rate" in message and "normalized" in message
    assert ledger.Ledger().rows(kind="train")[0]["status"] == "failed"


# --- non-finite weights never reach a checkpoint --------------------------------------------------
# lr=1e30: the one step's loss is finite (the guard sees losses before their update), the update is not.

def test_a_diverged_run_keeps_the_good_checkpoint_and_fails_naming_the_epoch(tmp_path):
    train.fit(tiny_config(tmp_path, max_steps=1), bundle=tensor_bundle(), progress=False, verbose=False)
    last = tmp_path / "checkpoints" / "last.pt"
    good = last.read_bytes()
    with pytest.raises(train.NonFiniteLossError) as caught:
        train.fit(tiny_config(tmp_path, max_steps=1, lr=1e30), bundle=tensor_bundle(), progress=False, verbose=False)
    message = str(caught.value)
    assert "validation loss" in message and "after epoch 1" in message and "\n" not in message
    assert last.read_bytes() == good  # the good checkpoint is still the one resume would use
    newest = ledger.Ledger().rows(kind="train")[0]
    assert newest["status"] == "failed" and "after epoch 1" in newest["metrics"]["error"]


def test_a_failed_rank_of_several_leaves_its_process_group_to_its_exit(tmp_path, monkeypatch):
    """Destroying the group before the error reaches torchrun's error file lets a peer fail first and take the blame
    (tests/test_torchrun.py, end to end); the process's exit closes the connections after the report."""
    destroyed = []
    rank_1_of_2 = train.Distributed(rank=1, world_size=2, local_rank=1, started_here=True)
    monkeypatch.setattr(train, "setup_distributed", lambda config: (rank_1_of_2, torch.device("cpu")))
    monkeypatch.setattr(train.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(train.dist, "destroy_process_group", lambda: destroyed.append("destroyed"))

    def prepare_that_fails(*args, **kwargs):
        raise RuntimeError("rank 1's own error")

    monkeypatch.setattr(train, "prepare", prepare_that_fails)
    with pytest.raises(RuntimeError, match="rank 1's own error"):
        train.fit(tiny_config(tmp_path), bundle=tensor_bundle(), progress=False, verbose=False)
    assert destroyed == []


def test_non_finite_weights_are_not_saved_even_without_validation(tmp_path, monkeypatch):
    real_step = train.optimizer_step

    def step_that_poisons_a_weight(optimizer, *args, **kwargs):  # what lr=inf did to 62 of 122 tensors
        skipped = real_step(optimizer, *args, **kwargs)
        with torch.no_grad():
            optimizer.param_groups[0]["params"][0].fill_(float("nan"))
        return skipped

    bundle = DataBundle(TensorImages(64, size=16), None, None, CLASSES, "no validation split")
    train.fit(tiny_config(tmp_path, max_steps=1), bundle=bundle, progress=False, verbose=False)
    good = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    monkeypatch.setattr(train, "optimizer_step", step_that_poisons_a_weight)
    with pytest.raises(train.NonFiniteLossError) as caught:
        train.fit(tiny_config(tmp_path, max_steps=1), bundle=bundle, progress=False, verbose=False)
    message = str(caught.value)
    assert "end of epoch 1" in message and "tensor model." in message and "still holds the last good" in message
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == good
    assert ledger.Ledger().rows(kind="train")[0]["status"] == "failed"


def test_each_save_keeps_the_checkpoint_it_replaces_as_prev(tmp_path):
    result = train.fit(tiny_config(tmp_path, epochs=3, max_steps=1), bundle=tensor_bundle(), progress=False,
                       verbose=False)
    folder = result.checkpoint_path.parent
    assert load_checkpoint(folder / "last.pt")["epoch"] == 3
    assert load_checkpoint(folder / checkpoint.PREVIOUS_NAME)["epoch"] == 2
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "prev.pt"]  # no temp file left behind


def test_cli_reports_diverged_weights_in_one_line_with_exit_1(tmp_path, capsys):
    from course_lib import cli

    code = cli.main(["train", "--profile", "smoke", "--no-progress", "-p", "lr=1e30", "-p", "max_steps=1",
                     "-p", f"output_dir={tmp_path / 'out'}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("workbook train: error: "), lines
    assert "epoch 1" in lines[0]
    assert not (tmp_path / "out" / "last.pt").exists()


# --- configuration errors ------------------------------------------------------------------------

def test_unknown_model_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown timm model"):
        factory.build_model(tiny_config(tmp_path, model="resnet_does_not_exist"), 4)


def test_too_few_images_for_one_step(tmp_path):
    with pytest.raises(ConfigError, match="fewer than one optimizer step"):
        train.fit(tiny_config(tmp_path, batch_size=64, accumulation_steps=2), bundle=tensor_bundle(),
                  progress=False, verbose=False)


# --- torchrun, 2 processes, gloo ----------------------------------------------------------------

RECORDING_SCRIPT = textwrap.dedent('''
    """Runs `workbook train` under torchrun, recording which images each rank reads."""
    import json, os, sys
    from course_lib import cli
    from course_lib.data import pipeline

    build = pipeline.build_datasets
    out = sys.argv.pop(1)

    class Recording:
        def __init__(self, dataset):
            self.dataset, self.seen = dataset, []
        def __len__(self):
            return len(self.dataset)
        def __getitem__(self, index):
            self.seen.append(int(index))
            return self.dataset[index]

    recorders = []
    def recording_build(config):
        bundle = build(config)
        bundle.train = Recording(bundle.train)
        recorders.append(bundle.train)
        return bundle

    pipeline.build_datasets = recording_build
    code = cli.main(["train", *sys.argv[1:]])
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as handle:
        json.dump({"code": code, "seen": recorders[0].seen}, handle)
    sys.exit(code)
''')


@pytest.mark.torchrun
def test_two_process_gloo_run_under_torchrun_sees_disjoint_data(tmp_path):
    script = tmp_path / "record_ranks.py"
    script.write_text(RECORDING_SCRIPT)
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path),
               "--profile", "smoke", "--no-progress", "-p", "model=test_resnet", "-p", "batch_size=8",
               "-p", "max_train_images=64", "-p", "max_steps=2", "-p", "epochs=1",
               "-p", f"output_dir={tmp_path / 'checkpoints'}"]
    # A session of its own, so that a hang kills torchrun *and* its workers, not torchrun alone.
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        pytest.fail(f"torchrun did not finish in 120 s: {stderr[-3000:]}")
    assert process.returncode == 0, stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["code"] == 0 for r in ranks)
    seen0, seen1 = set(ranks[0]["seen"]), set(ranks[1]["seen"])
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) == 16  # 2 steps x 8 images each
    assert seen0.isdisjoint(seen1)
    rows = ledger.Ledger().rows(kind="train")
    assert len(rows) == 1 and rows[0]["metrics"]["world_size"] == 2  # rank 0 records the run
    assert rows[0]["metrics"]["global_batch_size"] == 16
    assert (tmp_path / "checkpoints" / "last.pt").exists()


def test_an_output_folder_that_cannot_be_written_fails_before_training(tmp_path):
    """Issue 13 point 9: not after the first epoch. A file stands where the checkpoint folder should be."""
    from course_lib import paths

    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    bundle = tensor_bundle()
    with pytest.raises(paths.NotWritableError, match="a-file"):
        train.fit(tiny_config(tmp_path, output_dir=str(blocker / "checkpoints")), bundle=bundle, progress=False,
                  verbose=False)
    assert ledger.Ledger().rows(kind="train") == []  # refused before the run began: nothing trained, nothing recorded


# --- issue 30 point 4: one run per output folder ---------------------------------------------------

def test_a_second_run_on_the_same_output_folder_refuses_naming_the_first_runs_pid(tmp_path, capsys):
    """Both used to exit 0, and both ledger rows named one last.pt holding the weights of the last to finish."""
    from course_lib import cli, paths

    out = tmp_path / "checkpoints"
    holder = subprocess.Popen(  # the first run: holds the folder's lock until told to stop
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from course_lib import paths
            lock = paths.OutputLock({str(out)!r}).acquire()
            print("locked", flush=True)
            sys.stdin.readline()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(paths.FolderInUseError, match=f"PID {holder.pid} on "):
            train.fit(tiny_config(tmp_path), bundle=tensor_bundle(), progress=False, verbose=False)
        code = cli.main(["train", "--profile", "smoke", "--no-progress", "-p", f"output_dir={out}"])
        errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2 and len(errors) == 1 and f"PID {holder.pid}" in errors[0], errors
        assert not (out / "last.pt").exists() and ledger.Ledger().rows(kind="train") == []
    finally:
        holder.communicate("stop\n", timeout=30)
    # The holder is gone and its line is still in the file: a stale lock, taken over by the next run.
    assert f"PID {holder.pid}" in (out / paths.OutputLock.NAME).read_text()
    train.fit(tiny_config(tmp_path), bundle=tensor_bundle(), progress=False, verbose=False)
    assert (out / "last.pt").exists() and not (out / paths.OutputLock.NAME).exists()  # a finished run removes it
    train.fit(tiny_config(tmp_path), bundle=tensor_bundle(), progress=False, verbose=False)  # released at the end


def test_batch_size_one_with_batch_norm_on_a_1x1_map_is_one_line(tmp_path, capsys):
    from course_lib import cli
    from course_lib.engine import train

    assert cli.main(["train", "--profile", "smoke", "-p", "batch_size=1", "-p", f"output_dir={tmp_path / 'out'}",
                     "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "batch_size=1 leaves the BatchNorm layer layer4.0.bn1 of test_resnet at " \
                                      "image_size=32 one value per channel" in error, error
    import timm

    model = timm.create_model("test_resnet", num_classes=2)
    train.refuse_one_value_batch_norm(model, make_config("smoke", batch_size=1, image_size=128))  # 4x4 maps: fine
    train.refuse_one_value_batch_norm(model, make_config("smoke", batch_size=2, image_size=32))


def test_piped_epoch_progress_is_plain_lines_without_carriage_returns(tmp_path, capsys, monkeypatch):
    """`workbook train | tee log`: stderr is no terminal, so each epoch's bar is plain lines (here one per
    step: the line interval set to 0) and the log holds no tqdm carriage return."""
    from course_lib.instruments import progress

    monkeypatch.setattr(progress, "PLAIN_LINE_SECONDS", 0.0)
    train.fit(tiny_config(tmp_path, epochs=2, max_steps=3), bundle=tensor_bundle(), progress=True, verbose=False)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("epoch ")]
    assert lines[0].startswith("epoch 1/2: 1/") and " steps (" in lines[0]
    assert any(line.startswith("epoch 2/2: ") and line.endswith(", done") for line in lines)


def test_a_full_disk_at_the_very_end_keeps_the_finished_run(small_disk, monkeypatch, capsys):
    """Issue 49 point 9: the disk filled up after the last checkpoint, so monitor.csv and grad_norms.csv could
    not be written: the run was recorded as failed with no checkpoint, although last.pt held every epoch. On a
    real full filesystem, each side file is one warning and the run, its checkpoint and its row stand."""
    from conftest import fill_disk

    from course_lib import ledger
    from course_lib.engine import checkpoint_saver

    config = tiny_config(small_disk.parent, output_dir=str(small_disk / "run"), epochs=2, max_steps=2,
                         monitor_interval=0.05, grad_norm_log=True)
    save = checkpoint_saver.CheckpointSaver.save

    def save_then_fill(self, state, completed_epochs):
        written = save(self, state, completed_epochs)
        if completed_epochs == config.epochs:  # the disk is full from the last checkpoint on
            fill_disk(small_disk)
        return written

    monkeypatch.setattr(checkpoint_saver.CheckpointSaver, "save", save_then_fill)
    result = train.fit(config, bundle=tensor_bundle(), progress=False)
    out = capsys.readouterr().out
    assert "warning: monitor.csv was not written (No space left on device)" in out
    assert "warning: grad_norms.csv was not written (No space left on device)" in out
    assert result.checkpoint_path == small_disk / "run" / "last.pt" and len(result.history) == 2
    assert torch.load(result.checkpoint_path, weights_only=False)["epoch"] == 2
    row = ledger.Ledger().rows(kind="train")[0]
    assert row["status"] == "ok" and row["metrics"]["checkpoint"] == str(result.checkpoint_path)
    assert row["metrics"]["monitor_file"] is None and not (small_disk / "run" / "monitor.csv").exists()
