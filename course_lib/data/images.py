"""Image basics every data module shares: the image file extensions, the bad-image error, 8-bit RGB
from any mode (16-bit grey scaled, not clipped), and the listing of an ImageFolder tree with the
workbook's rules for links (the ones `workbook scan` reports). Imports no other data module.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import stat
from pathlib import Path

import numpy as np
from PIL import Image

from course_lib.config import WorkbookError

log = logging.getLogger(__name__)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


class BadImageError(WorkbookError, RuntimeError):
    """An image that cannot be decoded; the message names the file and the fix."""


class SplitClassesError(WorkbookError, ValueError):
    """Split folders (train/, val/, test/) with different class folders: each would number its own."""


# The split folders an image-folder dataset may hold, by split (the first one present is used).
SPLIT_FOLDER_NAMES = {"train": ("train",), "val": ("val", "valid", "validation"), "test": ("test",)}


def split_folders(root: Path) -> dict[str, Path]:
    """The split folders under `root` that exist, by split name ({} when `root` has none)."""
    found = {split: next((root / name for name in names if (root / name).is_dir()), None)
             for split, names in SPLIT_FOLDER_NAMES.items()}
    return {split: folder for split, folder in found.items() if folder is not None}


def class_mismatch(classes_of: dict[str, list[str]]) -> str | None:
    """None when every split holds train's classes, else one line naming what differs and the fix.
    `classes_of` maps split folder name (train first) to its class folder names. Labels are class
    indices in sorted order, so a class missing from val/ would shift every later class by one."""
    (train_name, train_classes), *others = classes_of.items()
    differences = []
    for name, classes in others:
        missing = [c for c in train_classes if c not in classes]
        extra = [c for c in classes if c not in train_classes]
        if missing:
            differences.append(f"{name}/ lacks {', '.join(missing)}")
        if extra:
            differences.append(f"{name}/ has {', '.join(extra)}, which {train_name}/ lacks")
    if not differences:
        return None
    return (f"the split folders hold different classes ({'; '.join(differences)}): each split would number its own "
            f"classes, so labels would not match; give every split the class folders of {train_name}/ "
            "(`workbook scan` lists them)")


# The fix every BadImageError offers last; a warning that a file was skipped leaves it out (skip is on).
SKIP_HINT = ", or set bad_images=skip"


def skipped_line(error: BaseException) -> str:
    """The BadImageError's message for a "skipping ..." warning: without the advice to turn skip on."""
    return str(error).replace(SKIP_HINT, "")


def decode_reason(error: BaseException, source) -> str:
    """A decoder's error text with the in-memory buffer's repr (PIL: "cannot identify image file
    <_io.BytesIO object at 0x...>") replaced by the file or shard member it came from."""
    return re.sub(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>", str(source), str(error))


class DataFolderError(WorkbookError, OSError):
    """A data folder that cannot be used as it is (unreadable, too few images to split, fewer than two
    classes); the message names the folder and the fix."""


def _unreadable(folder, error: OSError) -> DataFolderError:
    return DataFolderError(f"cannot read the folder {folder} ({error.strerror or error}); fix its permissions "
                           f"(e.g. chmod -R u+rX {shlex.quote(str(folder))}) or remove it")


# Modes holding more than 8 bits per channel, which PIL's convert("RGB") clips to 255 (white)
# instead of scaling: a 16-bit PNG opens as I;16 or as I (32-bit integers holding 0-65535).
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as 8-bit RGB; 16-bit grey is scaled (0-65535 to 0-255, rounded) rather than clipped, and a 32-bit
    float image (mode F), whose values have no 8-bit meaning to guess, is refused (PIL's convert clips it)."""
    if image.mode == "F":
        raise ValueError("mode F (a 32-bit float image): its values have no 8-bit meaning to guess; convert it to 8 bits")
    if image.mode not in SIXTEEN_BIT_MODES:
        return image.convert("RGB")
    pixels = np.asarray(image).astype(np.int64)
    if pixels.min(initial=0) < 0 or pixels.max(initial=0) > 65535:
        raise ValueError(f"mode {image.mode} with values outside 0-65535 (a 32-bit image); convert it to 8 bits")
    grey = ((pixels * 255 + 32767) // 65535).astype(np.uint8)  # 65535 -> 255, 257 -> 1: round(v / 257)
    return Image.fromarray(grey, "L").convert("RGB")


def load_rgb(path: str | os.PathLike) -> Image.Image:
    """Open an image as RGB (16-bit scaled to 8, see `to_rgb`), turning any decode failure into a
    BadImageError with the path."""
    try:
        with Image.open(path) as image:
            return to_rgb(image)
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise BadImageError(f"{path}: cannot decode image ({error}); remove or replace it{SKIP_HINT}") from None


def _not_a_readable_file(path: str) -> str | None:
    """Why `path` (named like an image) cannot be read as a file, or None: a broken or looping link,
    or something other than a regular file, such as a FIFO, whose read would block forever."""
    mode = os.lstat(path).st_mode  # one system call per file, as a plain listing costs
    if stat.S_ISLNK(mode):
        if os.path.isfile(path):  # isfile follows the link
            return None
        if os.path.exists(path):
            return (f"{path}: symbolic link to {os.readlink(path)}, which is not a regular file; "
                    "remove the link (`workbook scan` lists every link)")
        return (f"{path}: symbolic link to {os.readlink(path)}, which does not exist or loops back; "
                "remove the link or restore its target (`workbook scan` lists every link)")
    if not stat.S_ISREG(mode):
        return (f"{path}: not a regular file ({file_type_name(mode)}), so reading it could block forever; "
                "remove it or replace it with the image file (`workbook scan` lists these)")
    return None


def file_type_name(mode: int) -> str:
    """What kind of file system entry an `os.stat` mode describes, in words ("a FIFO")."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a file"


def list_image_folder(root: Path, *, follow_links: bool = False,
                      bad_images: str = "fail") -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, samples) of an ImageFolder tree in torchvision's order, agreeing with `workbook scan`: folder links
    are followed only with `follow_links`, each real folder once (torchvision's walk follows every one, forever); a
    broken file link or a FIFO named like an image raises BadImageError (bad_images=fail) or is left out (skip)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

    try:
        classes, class_to_index = find_classes(str(root))
    except PermissionError as error:
        raise _unreadable(root, error) from None
    samples = []
    for name in classes:
        folders, visited, unreadable = [], set(), []
        # os.walk skips a folder it cannot list unless told: that would read as "no images" below.
        for folder, subfolders, files in os.walk(root / name, followlinks=follow_links, onerror=unreadable.append):
            real = os.path.realpath(folder)
            if real in visited:  # a link back to a folder already walked
                subfolders[:] = []
                continue
            visited.add(real)
            subfolders.sort()  # which link reaches a real folder first must not depend on listing order
            if not follow_links:
                for linked in (d for d in subfolders if os.path.islink(os.path.join(folder, d))):
                    log.warning("not following the folder link %s (class %s); copy the images in, or pass "
                                "follow_links=True (`workbook scan` counts what it would add)",
                                os.path.join(folder, linked), name)
            folders.append((folder, files))
        if unreadable:
            raise _unreadable(unreadable[0].filename, unreadable[0])
        for folder, files in sorted(folders):
            for file_name in sorted(files):
                path = os.path.join(folder, file_name)
                if not file_name.lower().endswith(IMG_EXTENSIONS):
                    continue
                message = _not_a_readable_file(path)
                if message:
                    if bad_images == "fail":
                        raise BadImageError(message)
                    log.warning("skipping %s", message)
                    continue
                samples.append((path, class_to_index[name]))
    empty = sorted(set(classes) - {classes[target] for _, target in samples})
    if empty:  # torchvision's ImageFolder refuses these too (allow_empty=False)
        raise FileNotFoundError(f"no image files ({', '.join(IMG_EXTENSIONS)}) in the class folder(s) "
                                f"{', '.join(empty)} of {root}; add images or remove the folder")
    return classes, samples
