"""`workbook scan`: check an image folder without crashing, one line per unreadable, truncated,
zero-byte, wrong-extension or unusual-mode file.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from PIL import Image

from course_lib.data.datasets import IMAGE_EXTENSIONS

_USUAL_MODES = ("RGB", "L")
# ImageNet statistics: what timm's pretrained CNNs expect (timm.data.IMAGENET_DEFAULT_MEAN/STD).
_FORMAT_EXTENSIONS = {"JPEG": (".jpg", ".jpeg"), "PNG": (".png",), "BMP": (".bmp",), "WEBP": (".webp",),
                      "TIFF": (".tif", ".tiff"), "GIF": (".gif",)}


@dataclasses.dataclass
class ScanProblem:
    path: str
    kind: str  # zero-byte | unreadable | truncated | wrong-extension | unusual-mode | not-an-image
    detail: str

    def __str__(self):
        return f"{self.path}: {self.kind}: {self.detail}"


def scan_file(path: Path) -> list[ScanProblem]:
    """Problems with one file (empty list when it is a clean image)."""
    if path.stat().st_size == 0:
        return [ScanProblem(str(path), "zero-byte", "file is empty; delete it or restore it from the source")]
    problems = []
    try:
        with Image.open(path) as image:
            image_format, mode = image.format, image.mode
            image.load()  # full decode: catches truncation that open() alone does not
    except OSError as error:
        kind = "truncated" if "truncated" in str(error).lower() else "unreadable"
        if isinstance(error, Image.UnidentifiedImageError):
            kind = "unreadable" if path.suffix.lower() in IMAGE_EXTENSIONS else "not-an-image"
        return [ScanProblem(str(path), kind, f"{error}; re-export or remove it")]
    except (ValueError, SyntaxError, Image.DecompressionBombError) as error:
        return [ScanProblem(str(path), "unreadable", f"{error}; re-export or remove it")]
    expected = _FORMAT_EXTENSIONS.get(image_format, ())
    if expected and path.suffix.lower() not in expected:
        problems.append(ScanProblem(str(path), "wrong-extension",
                                    f"contents are {image_format} but the name ends {path.suffix or '(none)'}; "
                                    f"rename it to {expected[0]}"))
    if mode not in _USUAL_MODES:
        problems.append(ScanProblem(str(path), "unusual-mode",
                                    f"mode {mode} (loaders convert to RGB; check colours/alpha are as intended)"))
    return problems


def scan_folder(root: str | os.PathLike) -> tuple[int, list[ScanProblem]]:
    """Scan every file under `root`; returns (files checked, problems)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder; give the folder that holds the images")
    checked, problems = 0, []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.name.startswith(".") or path.suffix.lower() in (".json", ".txt", ".md", ".csv"):
            continue
        checked += 1
        problems.extend(scan_file(path))
    return checked, problems
