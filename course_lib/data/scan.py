"""`workbook scan`: check an image folder without crashing, one line per problem file: unreadable,
truncated, zero-byte, wrong extension, unusual or 16-bit mode, decompression bombs (judged from
the header, never decoded), tiny images and images far from the dataset's usual size, FIFOs and
other files that are not regular files, and symbolic links (broken, looping, links to folders,
links out of the dataset); then the layout: an empty folder, class folders without images, a
single class, and split folders (train/ val/ test/) whose class folders differ.

Links matter because torchvision's ImageFolder walks with `os.walk(followlinks=True)`: a link to a
folder inside a class folder adds every image behind it to that class, and a link to an ancestor
never ends. Scan does not follow folder links unless asked (`follow_links=True`), and says how many
images each one would add; the workbook's loader (`images.list_image_folder`) keeps the same rules. Pillow's decompression-bomb limit: https://pillow.readthedocs.io/en/stable/reference/Image.html#PIL.Image.open
"""
from __future__ import annotations

import dataclasses
import math
import os
import stat
import statistics
import warnings
from pathlib import Path

from PIL import Image

from course_lib.data.images import IMAGE_EXTENSIONS, class_mismatch, file_type_name, split_folders

_USUAL_MODES = ("RGB", "L")
# More than 8 bits per channel. The loader scales 16-bit grey to 8 bits (images.to_rgb: round(v / 257);
# OpenCV keeps the high byte); values beyond 0-65535 (32-bit integers, floats) are refused in one line.
_HIGH_BIT_DEPTH_MODES = {"I;16": "16-bit", "I;16B": "16-bit", "I;16L": "16-bit", "I;16N": "16-bit",
                         "I": "32-bit integer", "F": "32-bit float"}
_FORMAT_EXTENSIONS = {"JPEG": (".jpg", ".jpeg"), "PNG": (".png",), "BMP": (".bmp",), "WEBP": (".webp",),
                      "TIFF": (".tif", ".tiff"), "GIF": (".gif",)}
_SKIPPED_SUFFIXES = (".json", ".txt", ".md", ".csv")
# A decompression bomb: many pixels from few bytes. Natural images compress to about 0.1-3 bytes
# per pixel; more than 100 pixels per byte at tens of megapixels is a bomb or a mistaken export.
BOMB_PIXELS = 40_000_000  # pixels; above any training image, below Pillow's 89-megapixel warning
BOMB_PIXELS_PER_BYTE = 100
TINY_SIDE = 8  # pixels: a shorter side cannot show a class
ODD_SIZE_FACTOR = 8  # an image whose side (sqrt of its area) is this many times off the median
ODD_SIZE_MINIMUM_IMAGES = 5  # images needed before a median means anything


@dataclasses.dataclass
class ScanProblem:
    path: str
    # zero-byte | unreadable | truncated | wrong-extension | unusual-mode | not-an-image | high-bit-depth |
    # decompression-bomb | tiny-image | odd-size | broken-link | looping-link | directory-link | outside-link |
    # not-a-file | empty-folder | empty-class | single-class | split-classes
    kind: str
    detail: str

    def __str__(self):
        # A file name may hold a newline or other control character: shown escaped, it cannot forge a
        # line of its own in the report.
        return f"{printable(self.path)}: {self.kind}: {printable(self.detail)}"


def printable(text: str) -> str:
    """`text` with control characters (newline, carriage return, escape ...) written as escapes."""
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
                   for ch in str(text))


def _inspect(path: Path, shown: Path | None = None) -> tuple[list[ScanProblem], tuple[int, int] | None]:
    """Problems with one image file and its (width, height) when the header could be read; `shown`: the name to
    report (a link's own path when `path` is its target)."""
    name = str(shown or path)
    status = path.stat()
    if not stat.S_ISREG(status.st_mode):  # never opened: reading a FIFO blocks until a writer comes
        return [ScanProblem(name, "not-a-file", f"{file_type_name(status.st_mode)}, not a regular file: the loader "
                                                "refuses it; remove it or replace it with the image file")], None
    file_size = status.st_size
    if file_size == 0:
        return [ScanProblem(name, "zero-byte", "file is empty; delete it or restore it from the source")], None
    problems = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # judged below, from the header
            with Image.open(path) as image:
                image_format, mode, (width, height) = image.format, image.mode, image.size
                pixels = width * height
                if pixels > BOMB_PIXELS and pixels / file_size > BOMB_PIXELS_PER_BYTE:
                    return [ScanProblem(name, "decompression-bomb",
                                        f"{width}x{height} pixels ({pixels / 1e6:.0f} megapixels) from a "
                                        f"{file_size / 1e3:.0f} KB file; not decoded; remove it")], (width, height)
                image.load()  # full decode: catches truncation that open() alone does not
    except Image.DecompressionBombError as error:
        return [ScanProblem(name, "decompression-bomb", f"{error}; not decoded; remove it")], None
    except OSError as error:
        kind = "truncated" if "truncated" in str(error).lower() else "unreadable"
        if isinstance(error, Image.UnidentifiedImageError):
            kind = "unreadable" if path.suffix.lower() in IMAGE_EXTENSIONS else "not-an-image"
        return [ScanProblem(name, kind, f"{error}; re-export or remove it")], None
    except (ValueError, SyntaxError) as error:
        return [ScanProblem(name, "unreadable", f"{error}; re-export or remove it")], None
    expected = _FORMAT_EXTENSIONS.get(image_format, ())
    suffix = Path(name).suffix
    if expected and suffix.lower() not in expected:
        problems.append(ScanProblem(name, "wrong-extension",
                                    f"contents are {image_format} but the name ends {suffix or '(none)'}; "
                                    f"rename it to {expected[0]}"))
    if mode in _HIGH_BIT_DEPTH_MODES:
        what = ("the loaders refuse it (its values have no 8-bit meaning to guess; PIL's own conversion would clip "
                "them); re-export it as 8-bit" if mode == "F" else
                "the loaders scale 16-bit values to 8 bits (round(v / 257); OpenCV keeps the high byte), so the finer "
                "levels are lost, and values beyond 0-65535 are refused; re-export it as 8-bit if that matters")
        if image_format == "TIFF":
            what += "; torchvision's decoder (decoder=torchvision, the speed-run recipe's) reads no TIFF: use decoder=pil"
        problems.append(ScanProblem(name, "high-bit-depth", f"mode {mode} ({_HIGH_BIT_DEPTH_MODES[mode]}): {what}"))
    elif mode not in _USUAL_MODES:
        problems.append(ScanProblem(name, "unusual-mode",
                                    f"mode {mode} (loaders convert to RGB; check colours/alpha are as intended)"))
    if min(width, height) < TINY_SIDE:
        problems.append(ScanProblem(name, "tiny-image", f"{width}x{height} pixels: too small to show its class; "
                                                        "remove it or replace it with the full image"))
    return problems, (width, height)


def scan_file(path: Path) -> list[ScanProblem]:
    """Problems with one file (empty list when it is a clean image)."""
    return _inspect(Path(path))[0]


def _image_count(folder: Path) -> int:
    """Image files under `folder`, following links as a loader would but each real folder once (a cycle ends)."""
    count, seen = 0, set()
    for current, subfolders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:  # a link back to a folder already counted
            subfolders[:] = []
            continue
        seen.add(real)
        count += sum(Path(name).suffix.lower() in IMAGE_EXTENSIONS and os.path.isfile(os.path.join(current, name))
                     for name in files)
    return count


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _check_link(link: Path, root: Path) -> tuple[list[ScanProblem], Path | None]:
    """Problems with a symbolic link, and what to scan through it: its resolved target (a folder: with follow_links)."""
    target = os.readlink(link)
    try:
        resolved = link.resolve(strict=True)
    except FileNotFoundError:
        return [ScanProblem(str(link), "broken-link", f"symbolic link to {target}, which does not exist; the loader "
                                                      "fails on it; remove the link or restore its target")], None
    except (OSError, RuntimeError):  # ELOOP; pathlib raises RuntimeError for a loop before Python 3.13
        return [ScanProblem(str(link), "looping-link", f"symbolic link to {target} that leads back to itself; "
                                                       "the loader fails on it; remove it")], None
    real_root = root.resolve()
    outside = not _inside(resolved, real_root)
    if resolved.is_dir():
        if _inside(link.parent.resolve(), resolved):
            return [ScanProblem(str(link), "looping-link",
                                f"links to {resolved}, a folder that contains the link itself: a loader that "
                                "follows links walks it forever; remove it")], None
        where = "outside the dataset" if outside else "inside the dataset (its images are counted twice)"
        return [ScanProblem(str(link), "directory-link",
                            f"links to the folder {resolved}, {where}, holding {_image_count(resolved)} image "
                            f"file(s); torchvision's ImageFolder follows it and labels them all with this folder's "
                            "class; copy the images in or remove the link")], resolved
    if outside:
        return [ScanProblem(str(link), "outside-link",
                            f"links to {resolved}, outside the dataset folder; the loader reads it, but a copy of "
                            "the dataset will miss it; copy the file in")], resolved
    return [], resolved


def _entries(root: Path, problems: list[ScanProblem]) -> list[tuple[Path, bool]]:
    """(path, is_link) of every file and link under `root` (folder links unfollowed); unlistable ones to `problems`."""
    found, stack = [], [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as error:
            problems.append(ScanProblem(str(folder), "unreadable", f"folder cannot be listed ({error.strerror}); "
                                                                   "fix its permissions"))
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                found.append((path, True))
            elif entry.is_dir(follow_symlinks=False):
                stack.append(path)
            else:  # regular files, and FIFOs, sockets or devices, which `_inspect` reports unopened
                found.append((path, False))
    return sorted(found)


def _skipped(path: Path) -> bool:
    return path.name.startswith(".") or path.suffix.lower() in _SKIPPED_SUFFIXES


def scan_folder(root: str | os.PathLike, *, follow_links: bool = False) -> tuple[int, list[ScanProblem]]:
    """(files checked, problems) of every file under `root`: links reported (`_check_link`) and scanned through,
    folder links only with `follow_links` (each real folder once); image sizes compared with the median at the end."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder; give the folder that holds the images")
    checked, problems, sizes = 0, [], {}
    visited_folders: set[Path] = set()
    pending = _entries(root, problems)
    for path, is_link in pending:  # followed folder links append to `pending` while it is walked
        if _skipped(path):
            continue
        target, shown = path, None
        if is_link:
            link_problems, resolved = _check_link(path, root)
            problems.extend(link_problems)
            if resolved is None:
                continue
            if resolved.is_dir():
                if follow_links and resolved not in visited_folders:
                    visited_folders.add(resolved)
                    pending.extend(_entries(resolved, problems))
                continue
            target, shown = resolved, path
        checked += 1
        file_problems, size = _inspect(target, shown)
        problems.extend(file_problems)
        if size is not None:
            sizes[str(shown or path)] = (size, {p.kind for p in file_problems})
    problems.extend(_odd_sizes(sizes))
    problems.extend(_layout_problems(root, empty=checked == 0 and not problems))
    problems.sort(key=lambda problem: problem.path)  # stable: one file's lines stay together, in order
    return checked, problems


def _odd_sizes(sizes: dict[str, tuple[tuple[int, int], set[str]]]) -> list[ScanProblem]:
    """Images whose side (sqrt of the area) is over ODD_SIZE_FACTOR times the median side or under the median over it:
    a thumbnail, an icon or a whole scene among tiles."""
    if len(sizes) < ODD_SIZE_MINIMUM_IMAGES:
        return []
    sides = {name: math.sqrt(width * height) for name, ((width, height), _) in sizes.items()}
    median = statistics.median(sides.values())
    problems = []
    for name, side in sorted(sides.items()):
        (width, height), kinds = sizes[name]
        if kinds & {"tiny-image", "decompression-bomb"} or median == 0:
            continue
        factor = side / median
        if factor > ODD_SIZE_FACTOR or factor < 1 / ODD_SIZE_FACTOR:
            relation = f"{factor:.0f}x larger" if factor > 1 else f"{1 / factor:.0f}x smaller"
            problems.append(ScanProblem(name, "odd-size",
                                        f"{width}x{height} pixels, {relation} than this folder's usual image "
                                        f"(median side {median:.0f} px); check it belongs to the dataset"))
    return problems


def _class_folders(folder: Path) -> list[str] | None:
    """The class folder names the loader sees in `folder` (torchvision's `find_classes`: every
    entry that is a folder or links to one, sorted), or None when `folder` cannot be listed."""
    try:
        return sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    except OSError:
        return None  # reported as unreadable by the walk


def _holds_an_image(folder: Path) -> bool | None:
    """Whether the loader finds an image file in `folder` (folder links not followed); None when a
    folder in it cannot be listed (reported as unreadable by the walk)."""
    unlistable: list[ScanProblem] = []
    found = _entries(folder, unlistable)
    return None if unlistable else any(path.name.lower().endswith(IMAGE_EXTENSIONS) for path, _ in found)


def dataset_folders(root: Path) -> list[Path]:
    """The datasets in `root` when it is a folder of datasets (data_samples/: every subfolder has train/
    or val/ of its own), else []. Such a folder has no classes of its own to check."""
    if split_folders(root):
        return []
    try:
        children = sorted(Path(entry.path) for entry in os.scandir(root) if entry.is_dir())
    except OSError:
        return []  # reported as unreadable by the walk
    return children if children and all(split_folders(child) for child in children) else []


def _layout_problems(root: Path, empty: bool) -> list[ScanProblem]:
    """What the loader would refuse or get wrong in the layout: nothing to check, class folders without images, a
    single class, splits whose classes differ from train/'s; a folder of datasets has each dataset checked."""
    if empty:
        return [ScanProblem(str(root), "empty-folder", "no files to check; give the folder that holds train/ and "
                                                       "val/, or the class folders")]
    datasets = dataset_folders(root)
    if datasets:  # data_samples/: its subfolders are datasets, not classes
        return [problem for folder in datasets for problem in _layout_problems(folder, empty=False)]
    splits = split_folders(root)
    problems, classes_of = [], {}
    for folder in splits.values() or [root]:
        classes = _class_folders(folder)
        if classes is None or (not classes and not splits):
            continue
        classes_of[folder.name] = classes
        if not classes:
            problems.append(ScanProblem(str(folder), "empty-class", "no class folders in it; the loader needs one "
                                                                    "folder of images per class"))
        for name in classes:
            if _holds_an_image(folder / name) is False:
                problems.append(ScanProblem(str(folder / name), "empty-class",
                                            f"class folder without image files ({', '.join(IMAGE_EXTENSIONS)}); "
                                            "the loader refuses it; add images or remove the folder"))
    train = splits.get("train", None if splits else root)  # the folder whose classes the loader uses
    if train is None or train.name not in classes_of:
        return problems
    if len(classes_of[train.name]) == 1:
        problems.append(ScanProblem(str(train), "single-class", f"only one class ({classes_of[train.name][0]}): a "
                                                                "classifier needs at least 2; add the other classes' folders"))
    if splits and len(classes_of) > 1:
        mismatch = class_mismatch(classes_of)
        if mismatch:
            problems.append(ScanProblem(str(root), "split-classes", mismatch))
    return problems
