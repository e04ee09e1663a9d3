import io

import numpy as np
import pytest
from PIL import Image

from course_lib import cli
from course_lib.data import scan


@pytest.fixture
def messy_folder(tmp_path):
    good = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    good.save(tmp_path / "good.jpg")
    buffer = io.BytesIO()
    good.save(buffer, format="JPEG")
    (tmp_path / "truncated.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "garbage.jpg").write_bytes(b"this is not an image at all")
    good.save(tmp_path / "actually_png.jpg", format="PNG")
    good.convert("CMYK").save(tmp_path / "cmyk.jpg")
    (tmp_path / "notes.bin").write_bytes(b"\x00\x01")
    return tmp_path


def test_scan_reports_each_problem_kind(messy_folder):
    checked, problems = scan.scan_folder(messy_folder)
    kinds = {p.path.split("/")[-1]: p.kind for p in problems}
    assert checked == 7
    assert kinds == {"truncated.jpg": "truncated", "empty.jpg": "zero-byte", "garbage.jpg": "unreadable",
                     "actually_png.jpg": "wrong-extension", "cmyk.jpg": "unusual-mode", "notes.bin": "not-an-image"}


def test_scan_cli_exit_codes(messy_folder, tmp_path_factory, capsys):
    assert cli.main(["scan", str(messy_folder)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith(str(messy_folder / "empty.jpg")) and "zero-byte" in line for line in lines)
    assert lines[-1] == "checked 7 files: 6 problem(s)"
    clean = tmp_path_factory.mktemp("clean")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(clean / "ok.png")
    assert cli.main(["scan", str(clean)]) == 0


def test_scan_missing_folder_is_one_line(tmp_path, capsys):
    assert cli.main(["scan", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and len(err.strip().splitlines()) == 1


def test_data_make_cli(tmp_path, capsys):
    out = tmp_path / "lc"
    assert cli.main(["data", "make", "--out", str(out), "--image-size", "24", "--train", "1", "--val", "1",
                     "--test", "0"]) == 0
    assert "wrote 16 images" in capsys.readouterr().out
    assert cli.main(["data", "make", "--out", str(out)]) == 2
