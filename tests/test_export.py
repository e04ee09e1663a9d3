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


def test_onnx_round_trip_matches_pytorch(model, tmp_path):
    images = torch.randn(3, 3, 32, 32)
    served = export.onnx_model(export.export_onnx(model, images, tmp_path / "m.onnx"))
    assert export.max_difference(model, served, images) <= export.FP32_TOLERANCE
    assert served(torch.randn(1, 3, 32, 32)).shape == (1, 4)  # the batch dimension is dynamic


def test_pt2_round_trip_matches_pytorch(model, tmp_path):
    images = torch.randn(3, 3, 32, 32)
    served = export.pt2_model(export.export_pt2(model, images, tmp_path / "m.pt2"))
    assert export.max_difference(model, served, images) <= export.FP32_TOLERANCE
    assert served(torch.randn(5, 3, 32, 32)).shape == (5, 4)


def test_a_wrong_model_is_caught_by_the_check(model, tmp_path):
    images = torch.randn(3, 3, 32, 32)
    other = timm.create_model("test_resnet", num_classes=4).eval()
    assert export.max_difference(model, other, images) > export.FP32_TOLERANCE


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
