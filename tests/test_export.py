"""Export round trips within the stated tolerance, and `workbook export` on a `workbook train` checkpoint."""
import json

import pytest
import timm
import torch

from course_lib import cli
from course_lib.deploy import export


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return timm.create_model("test_resnet", num_classes=4).eval()


@pytest.mark.slow
def test_onnx_round_trip_matches_pytorch(model, tmp_path):
    images = torch.randn(3, 3, 32, 32)
    served = export.onnx_model(export.export_onnx(model, images, tmp_path / "m.onnx"))
    assert export.max_difference(model, served, images) <= export.FP32_TOLERANCE
    assert served(torch.randn(1, 3, 32, 32)).shape == (1, 4)  # the batch dimension is dynamic


@pytest.mark.slow
def test_pt2_round_trip_matches_pytorch(model, tmp_path):
    images = torch.randn(3, 3, 32, 32)
    served = export.pt2_model(export.export_pt2(model, images, tmp_path / "m.pt2"))
    assert export.max_difference(model, served, images) <= export.FP32_TOLERANCE
    assert served(torch.randn(5, 3, 32, 32)).shape == (5, 4)


def test_a_wrong_model_is_caught_by_the_check(model, tmp_path):
    images = torch.randn(3, 3, 32, 32)
    other = timm.create_model("test_resnet", num_classes=4).eval()
    assert export.max_difference(model, other, images) > export.FP32_TOLERANCE


@pytest.mark.slow
def test_workbook_export_on_a_workbook_train_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "--profile", "smoke", "-p", f"output_dir={out}", "-p", "max_steps=2"]) == 0
    assert cli.main(["export", str(out / "last.pt"), "--format", "onnx", "--repeats", "1"]) == 0
    report = json.loads((out / "last.onnx.json").read_text())
    assert report["format"] == "onnx" and not report["int8"] and (out / "last.onnx").exists()
    assert report["max_abs_logit_difference"] <= export.FP32_TOLERANCE
    assert report["top1"] == pytest.approx(report["pytorch_top1"], abs=0.02)
    assert report["latency"]["ms@1"] > 0 and report["hardware"]
    assert cli.main(["export", str(out / "last.pt"), "--format", "pt2", "--int8", "--repeats", "1"]) == 0
    report = json.loads((out / "last-int8.pt2.json").read_text())
    assert report["int8"] and abs(report["top1"] - report["pytorch_top1"]) <= 0.05
    assert "wrote" in capsys.readouterr().out


def test_export_refuses_a_missing_checkpoint_in_one_line(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path / "nothing.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_export_never_writes_over_the_checkpoint_or_an_existing_file(tmp_path, capsys):
    """Issue 30 point 2: `--output ck/last.pt` replaced the checkpoint with ONNX and exited 0, and
    --int8 overwrote, then deleted, an existing <stem>-fp32.onnx."""
    out = tmp_path / "run"
    assert cli.main(["train", "--profile", "smoke", "--no-progress", "-p", f"output_dir={out}", "-p", "max_steps=1"]) == 0
    checkpoint_bytes = (out / "last.pt").read_bytes()
    capsys.readouterr()
    for output in (out / "last.pt", out / "." / "last.pt"):
        assert cli.main(["export", str(out / "last.pt"), "--output", str(output), "--force"]) == 2
        errors = capsys.readouterr().err.strip().splitlines()
        assert len(errors) == 1 and "is the checkpoint being exported" in errors[0], errors
    assert (out / "last.pt").read_bytes() == checkpoint_bytes
    (out / "last-int8.onnx").write_text("an earlier artifact")
    assert cli.main(["export", str(out / "last.pt"), "--int8"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert (out / "last-int8.onnx").read_text() == "an earlier artifact"
    (out / "last-int8-fp32.onnx").write_text("someone's own file")
    assert cli.main(["export", str(out / "last.pt"), "--int8", "--force", "--repeats", "1"]) == 0
    assert (out / "last-int8-fp32.onnx").read_text() == "someone's own file"
    assert (out / "last-int8.onnx").read_bytes()[:2] != b"an" and (out / "last.pt").read_bytes() == checkpoint_bytes
    assert not list(out.glob(".*.tmp")), "temp files left behind"


@pytest.fixture(scope="module")
def sample_checkpoint(tmp_path_factory):
    """A checkpoint as `workbook train --profile smoke` writes it (test_resnet, the committed sample's classes),
    saved directly so the refusals below need no training."""
    from course_lib.config import make_config
    from course_lib.models import checkpoint
    from tests.conftest import SAMPLE_DIR

    classes = sorted(p.name for p in (SAMPLE_DIR / "train").iterdir() if p.is_dir())
    state = {"model": timm.create_model("test_resnet", num_classes=len(classes)).state_dict(),
             "config": make_config("smoke").to_dict(), "classes": classes, "epoch": 1, "history": []}
    return checkpoint.save_checkpoint(state, tmp_path_factory.mktemp("ck") / "last.pt")


def _without(path, entry, folder):
    from course_lib.models import checkpoint

    state = torch.load(path, weights_only=True)
    del state[entry]
    return str(checkpoint.save_checkpoint(state, folder / f"no-{entry}.pt"))


@pytest.mark.parametrize("command", ["eval", "export"])
@pytest.mark.parametrize("arguments, message", [
    (["-p", "model=resnet18"], "-p model=resnet18 does not fit .*which holds a test_resnet; drop -p model="),
    (["-p", "activation=relu"], "-p activation=relu does not fit .*which holds activation=''; drop -p activation="),
    (["-p", "dataset=digits"], "trained on classes .* but sklearn.datasets.load_digits has .*"),
    ("no-classes", "has no 'classes' entry, so its model and data cannot be rebuilt; use a checkpoint written by"),
    ("no-config", "has no 'config' entry"),
])
def test_a_checkpoint_that_does_not_fit_is_one_line_with_the_fix(sample_checkpoint, tmp_path, capsys, command,
                                                                 arguments, message):
    import re

    target = str(sample_checkpoint)
    if isinstance(arguments, str):  # a checkpoint missing one entry
        target, arguments = _without(sample_checkpoint, arguments.split("-", 1)[1], tmp_path), []
    out = ["--out", str(tmp_path / "evals")] if command == "eval" else ["--output", str(tmp_path / "m.onnx")]
    assert cli.main([command, target, *arguments, *out]) == 2
    error = capsys.readouterr().err
    assert re.search(message, error) and error.count("\n") == 1, error


@pytest.mark.parametrize("views", ["0", "-1", "9"])
def test_eval_refuses_an_unsupported_number_of_tta_views_in_one_line(sample_checkpoint, tmp_path, capsys, views):
    assert cli.main(["eval", str(sample_checkpoint), "--tta", views, "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"--tta {views} is not a number of views: give 1 (off) to 8" in error and error.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_outputs_that_cannot_be_written_are_refused_before_any_work(sample_checkpoint, tmp_path, capsys,
                                                                    monkeypatch):
    from course_lib import paths

    assert cli.main(["export", str(sample_checkpoint), "--repeats", "0", "--output", str(tmp_path / "m.onnx")]) == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err
    assert cli.main(["export", str(sample_checkpoint), "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path} is a folder; give a file path" in capsys.readouterr().err
    assert cli.main(["eval", str(sample_checkpoint), "--out", str(sample_checkpoint)]) == 2
    assert "a file of that name is in the way" in capsys.readouterr().err

    def read_only(*args, **kwargs):  # as root, chmod would not stop the write: refuse it here
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(paths, "open", read_only, raising=False)
    for command, flag in (("eval", "--out"), ("export", "--output")):
        target = tmp_path / "read-only" / ("m.onnx" if command == "export" else "")
        assert cli.main([command, str(sample_checkpoint), flag, str(target)]) == 2
        error = capsys.readouterr().err
        assert "(Permission denied)" in error and error.count("\n") == 1, error
    assert not list(tmp_path.glob("read-only/*"))
