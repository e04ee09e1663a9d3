"""`tensorboard=true` writes a run's curves as TensorBoard event files, which TensorBoard's own reader
gives back equal to the run's history (issue 50, point 10)."""
import pytest
from conftest import tiny_config

from course_lib.config import ConfigError
from course_lib.engine import tensorboard_log, train


def test_a_runs_event_file_holds_its_steps_epochs_grad_norms_and_utilisation(tmp_path, capsys):
    from test_train import tensor_bundle

    config = tiny_config(tmp_path, tensorboard=True, grad_norm_log=True, monitor_interval=0.05, epochs=2, max_steps=3)
    result = train.fit(config, bundle=tensor_bundle(), progress=False)
    folder = result.tensorboard_dir
    assert folder.parent == tmp_path / "checkpoints" / tensorboard_log.FOLDER  # one folder per run
    assert f"TensorBoard: tensorboard --logdir {folder}" in capsys.readouterr().out
    scalars = tensorboard_log.read_scalars(folder)
    assert [step for step, _ in scalars["step/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [value for _, value in scalars["step/lr"]] == pytest.approx([row["lr"] for row in result.step_log])
    assert [value for _, value in scalars["step/grad_norm"]] == pytest.approx(
        [row["grad_norm"] for row in result.grad_norms], rel=1e-6)
    for name in ("train_loss", "train_top1", "val_loss", "val_top1", "images_per_second", "lr"):
        assert scalars[f"epoch/{name}"] == [(row["epoch"], pytest.approx(row[name], rel=1e-6))
                                            for row in result.history], name
    assert scalars["utilisation/cpu_percent"] and scalars["utilisation/rss_bytes"]


def test_without_the_switch_nothing_is_written(tmp_path):
    from test_train import tensor_bundle

    train.fit(tiny_config(tmp_path, epochs=1, max_steps=2), bundle=tensor_bundle(), progress=False)
    assert not (tmp_path / "checkpoints" / tensorboard_log.FOLDER).exists()


def test_a_missing_tensorboard_package_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were absent
    with pytest.raises(ConfigError, match="tensorboard=true needs the tensorboard package: pip install tensorboard"):
        tensorboard_log.TensorBoardLog(tmp_path / "board")
