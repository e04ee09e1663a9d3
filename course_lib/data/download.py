"""Getting the real datasets (`workbook data get eurosat|cifar10|imagenette`): torchvision's archive
for each (its URL and md5: `torchvision.datasets.EuroSAT`, `CIFAR10`, `Imagenette` at 160 px),
downloaded with a progress bar and resumed when cut, checked, and laid out as an ImageFolder with
`train/`, `valid/` and `test/` folders of `<class>/<file>` under `data_cache/<name>/`, split as
`fixed_splits.py` says, so every reader trains and tests on the same images.

Nothing half-done counts as done: the archive, its extraction and the layout are made in a
staging folder beside the target (`.partial-<name>/`) and renamed into place only when complete,
with `MANIFEST.json` written last; a later run resumes the download or redoes the layout.

Sources: Helber et al., "EuroSAT", IEEE JSTARS 2019; Krizhevsky, "Learning Multiple Layers of
Features from Tiny Images", 2009 (CIFAR-10); fast.ai's Imagenette (github.com/fastai/imagenette).
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import os
import pickle
import shlex
import shutil
import stat
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import Callable

from course_lib.config import WorkbookError
from course_lib.data.build_lock import DISK_FULL, disk_full, exclusive_build
from course_lib.data.fixed_splits import LAYOUT_SPLITS, carve_out, load_eurosat_split
from course_lib.instruments.progress import Progress
from course_lib.instruments.timing import now
from course_lib.paths import CACHE_DIR, check_writable, is_project, project_root, resolve_path

DOWNLOADABLE = ("eurosat", "cifar10", "imagenette")
MANIFEST = "MANIFEST.json"  # written last into a finished layout: its presence means "done"
# torchvision.datasets.EuroSAT.download (torchvision >= 0.17) holds these two as literals, not
# attributes; tests/test_download.py checks they still agree with the installed torchvision.
EUROSAT_URL = ("https://huggingface.co/datasets/torchgeo/eurosat/resolve/c877bcd43f099cd0196738f714544e355477f3fd/"
               "EuroSAT.zip")
EUROSAT_MD5 = "c8fa014336c82ac7804f0398fcb19387"
IMAGENETTE_SIZE = "160px"  # 160 px on the short side: 94 MB instead of 1.5 GB, plenty for small CNNs
TIMEOUT_SECONDS = 60.0  # per connection attempt and per read; a stalled server fails instead of hanging
# A server that trickles (one byte every second or so) never trips the per-read timeout: a download that brings
# fewer than STALL_BYTES in STALL_SECONDS has stalled, and one still running after DEADLINE_SECONDS has taken too
# long (EuroSAT's 94 MB in 6 hours is 4 KB/s). Either keeps the part, so the next run resumes.
STALL_SECONDS = 60.0
STALL_BYTES = 64 * 1024
DEADLINE_SECONDS = 6 * 3600.0
ROOM_FIX = "free some space there, or pass --root a folder on another disk"
CHUNK_BYTES = 1 << 20  # read and write 1 MiB at a time
USER_AGENT = "pytorch/vision"  # what torchvision's download_url sends (some hosts refuse Python's default)
# Errors that mean "the network or the server let us down", as opposed to bad input.
NETWORK_ERRORS = (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException)


class DownloadError(WorkbookError, OSError):
    """The archive could not be fetched (offline, refused, cut, HTTP error); the message says the fix."""


class ArchiveError(WorkbookError, ValueError):
    """An archive that is not the release: wrong md5, unreadable, or laid out differently."""


@dataclasses.dataclass(frozen=True)
class Release:
    """One downloadable dataset: where its archive lives, its md5, and how it is laid out."""

    name: str
    title: str
    url: str
    md5: str
    images: int  # in the whole release, every split
    lay_out: Callable[[Path, Path, bool], dict]  # (extracted folder, layout folder, progress) -> images per split

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclasses.dataclass
class Result:
    """What `get` did: where the layout is, its images per split, and whether it was already there."""

    name: str
    folder: Path
    counts: dict
    already_done: bool = False
    warning: str = ""

    def summary(self) -> str:
        counts = ", ".join(f"{split} {self.counts.get(split, 0):,}" for split in LAYOUT_SPLITS)
        if self.already_done:
            return f"{self.name}: already laid out in {self.folder} ({counts}); nothing to do"
        return f"{self.name}: laid out {sum(self.counts.values()):,} images in {self.folder} ({counts})"


def release(name: str) -> Release:
    """The Release called `name`, its URL and md5 read from torchvision's dataset classes."""
    from torchvision.datasets import CIFAR10, Imagenette

    if name == "eurosat":
        return Release(name, "EuroSAT RGB", EUROSAT_URL, EUROSAT_MD5, 27_000, _lay_out_eurosat)
    if name == "cifar10":
        return Release(name, "CIFAR-10", CIFAR10.url, CIFAR10.tgz_md5, 60_000, _lay_out_cifar10)
    if name == "imagenette":
        url, md5 = Imagenette._ARCHIVES[IMAGENETTE_SIZE]
        return Release(name, f"Imagenette ({IMAGENETTE_SIZE})", url, md5, 9_469 + 3_925, _lay_out_imagenette)
    raise WorkbookError(f"unknown dataset {name!r}; choose one of {', '.join(DOWNLOADABLE)}")


def default_folder(name: str) -> Path:
    """Where `workbook data get NAME` lays the data out: data_cache/<name>/ under the project root."""
    return resolve_path(CACHE_DIR / name)


# --- fetching and checking the archive ---------------------------------------------------------

def unreachable(name: str, url: str, reason, then: str = "") -> DownloadError:
    """The one-line error for an archive that cannot be fetched: the URL, the reason, the fix
    (`then`: what to do after it, for callers other than `workbook data get`)."""
    filename = url.rsplit("/", 1)[-1]
    return DownloadError(f"cannot download {url} ({_reason(reason)}); offline? fetch that file by hand on a machine "
                         f"that is online (a browser, or `curl -L -O {url}`), copy it here and run "
                         f"`workbook data get {name} --from {filename}`{then}")


def _reason(error) -> str:
    reason = getattr(error, "reason", None) or error
    return str(getattr(reason, "strerror", None) or reason) or type(error).__name__


def md5_of(path: Path) -> str:
    from torchvision.datasets.utils import calculate_md5

    return calculate_md5(path)


def _copy(response, handle, bar, stall_seconds: float, deadline_seconds: float) -> None:
    """Write what `response` sends into `handle` as it arrives (`read1`: a trickling server cannot hold one read for a
    whole chunk); TimeoutError when under STALL_BYTES came in `stall_seconds` or all took over `deadline_seconds`."""
    began = window = now()
    arrived = 0
    while chunk := response.read1(CHUNK_BYTES):
        handle.write(chunk)
        bar.update(len(chunk))
        arrived += len(chunk)
        clock = now()
        if clock - began > deadline_seconds:
            raise TimeoutError(f"still running after {deadline_seconds:g} s, the most a download may take")
        if clock - window >= stall_seconds:
            if arrived < STALL_BYTES:
                raise TimeoutError(f"stalled: {arrived:,} bytes in the last {clock - window:.0f} s")
            window, arrived = clock, 0


def fetch(url: str, destination: Path, name: str, *, progress: bool = True, timeout: float = TIMEOUT_SECONDS,
          stall_seconds: float = STALL_SECONDS, deadline_seconds: float = DEADLINE_SECONDS) -> Path:
    """Download `url` to `destination` through `<destination>.part`, resuming an earlier run's part with an HTTP Range
    request. A download cut short, stalled or past its deadline keeps the part (DownloadError); a full disk removes
    it (it would keep the disk full; DiskFullError)."""
    part = destination.with_name(destination.name + ".part")
    for attempt in range(2):  # a second time only when the server refused the range (416)
        start = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": USER_AGENT, **({"Range": f"bytes={start}-"} if start else {})}
        try:
            response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
        except urllib.error.HTTPError as error:
            if error.code == 416 and start and attempt == 0:  # the part is not a prefix of this file
                part.unlink()
                continue
            raise DownloadError(f"{url} answered HTTP {error.code} {error.reason}; fetch the file by hand and run "
                                f"`workbook data get {name} --from {destination.name}`") from None
        except NETWORK_ERRORS as error:
            raise unreachable(name, url, error) from None
        break
    with response:
        resumed = start and response.status == 206 and response.headers.get("Content-Range", "").startswith(
            f"bytes {start}-")
        start = start if resumed else 0  # a 200 answer is the whole file: start over
        total = start + response.length if response.length is not None else None
        cause = None
        try:
            with open(part, "ab" if start else "wb") as handle, Progress(
                    total, destination.name, in_bytes=True, initial=start, enabled=progress) as bar:
                _copy(response, handle, bar, stall_seconds, deadline_seconds)
        except NETWORK_ERRORS as error:
            cause = _reason(error)
        except OSError as error:
            if error.errno not in DISK_FULL:
                raise
            part.unlink(missing_ok=True)
            raise disk_full(part, total or 0, f"the download of {destination.name}", ROOM_FIX) from None
    received = part.stat().st_size
    if cause is not None or (total is not None and received != total):
        of = f" of {total / 1e6:.1f}" if total is not None else ""
        raise DownloadError(f"the download of {url} stopped after {received / 1e6:.1f}{of} MB "
                            f"({cause or 'the connection closed early'}); the part is kept in {part}: run the same "
                            "command again to resume")
    os.replace(part, destination)
    return destination


# --- the layouts -------------------------------------------------------------------------------

def _find_folder(extracted: Path, name: str, what: str) -> Path:
    """`name` at the top of the extracted archive or one level down (an archive wrapped in a folder)."""
    for candidate in (extracted / name, *sorted(extracted.glob(f"*/{name}"))):
        if candidate.is_dir():
            return candidate
    raise ArchiveError(f"no {name}/ folder in the extracted archive {extracted}; is it {what}?")


def _make_parent(target: Path, made: set) -> Path:
    """`target`, its folder created once (`made`: the folders made so far; 27,000 mkdir calls add up)."""
    if target.parent not in made:
        target.parent.mkdir(parents=True, exist_ok=True)
        made.add(target.parent)
    return target


def _lay_out_eurosat(extracted: Path, layout: Path, progress: bool) -> dict:
    """The release's JPEGs moved as they are from 2750/<Class>/ into <split>/<Class>/, the split
    from the committed file (fixed_splits.EUROSAT_SPLIT_FILE)."""
    images = _find_folder(extracted, "2750", "EuroSAT.zip")
    split_of = load_eurosat_split()
    counts, made = dict.fromkeys(LAYOUT_SPLITS, 0), set()
    for path in sorted(images.glob("*/*.jpg")):
        split = split_of.get(path.name)
        if split is None or path.name.rsplit("_", 1)[0] != path.parent.name:
            raise ArchiveError(f"{path.relative_to(extracted)} is not an image of the EuroSAT RGB release "
                               "(<Class>/<Class>_<n>.jpg); give torchvision's EuroSAT.zip")
        os.replace(path, _make_parent(layout / split / path.parent.name / path.name, made))  # a rename: one file system
        counts[split] += 1
    return counts


# What a CIFAR-10 batch may name: numpy's array reconstruction and, for bytes pickled by Python 3 at protocol 2,
# codecs' encode (it only turns a string into bytes); the batches are a dict of bytes, lists and one uint8 array.
# Anything else (os.system, eval ...) is refused before it is called.
CIFAR_PICKLE_NAMES = {(module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray")
                      for name in ("_reconstruct", "scalar")} | {("numpy", "ndarray"), ("numpy", "dtype"),
                                                                  ("_codecs", "encode")}


class _ArraysOnly(pickle.Unpickler):
    """An unpickler that builds numpy arrays, lists, dicts, bytes and numbers, and refuses every other class
    or function a pickle names (pickle.load would call whatever the file asks for)."""

    def find_class(self, module, name):
        if (module, name) not in CIFAR_PICKLE_NAMES:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR-10 batch never holds")
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return _ArraysOnly(handle, encoding="latin1").load()  # the batches were pickled by Python 2
    except (OSError, pickle.UnpicklingError, EOFError) as error:
        raise ArchiveError(f"cannot read the CIFAR-10 batch {path} ({error}); give torchvision's "
                           "cifar-10-python.tar.gz") from None


def _lay_out_cifar10(extracted: Path, layout: Path, progress: bool) -> dict:
    """PNGs written from the pickled batches: `train_<i>.png` (i: the image's index in data_batch_1..5
    read in order) in train/ or, for the carve-out (a tenth of each class, fixed_splits.carve_out),
    valid/; `test_<i>.png` (index in test_batch) in test/."""
    import numpy as np
    from PIL import Image
    from torchvision.datasets import CIFAR10

    base = _find_folder(extracted, CIFAR10.base_folder, "cifar-10-python.tar.gz")
    classes = _unpickle(base / CIFAR10.meta["filename"])[CIFAR10.meta["key"]]
    counts, made = dict.fromkeys(LAYOUT_SPLITS, 0), set()
    bar = Progress(None, "PNG files", unit="images", enabled=progress)
    for official, files in (("train", CIFAR10.train_list), ("test", CIFAR10.test_list)):
        batches = [_unpickle(base / file_name) for file_name, _ in files]
        pixels = np.concatenate([batch["data"] for batch in batches]).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        labels = [label for batch in batches for label in batch["labels"]]
        names = [f"{official}_{index:05d}.png" for index in range(len(labels))]
        by_class = [[name for name, label in zip(names, labels) if label == wanted] for wanted in set(labels)]
        valid = set().union(*(carve_out(members, "cifar10") for members in by_class)) if official == "train" else set()
        for image, label, file_name in zip(pixels, labels, names):
            split = "valid" if file_name in valid else official
            # Lossless at any level; level 1 writes about 3x faster than the default 6, files ~10% larger.
            Image.fromarray(image).save(_make_parent(layout / split / classes[label] / file_name, made), format="PNG",
                                        compress_level=1)
            counts[split] += 1
            bar.update()
    bar.close()
    return counts


def _lay_out_imagenette(extracted: Path, layout: Path, progress: bool) -> dict:
    """The JPEGs moved as they are: Imagenette's train/ into train/ and, for the carve-out (a tenth
    of each class, fixed_splits.carve_out), valid/; its val/ into test/. Class folders get readable
    names (tench, English_springer, ...) instead of WordNet ids."""
    from torchvision.datasets import Imagenette

    url, _ = Imagenette._ARCHIVES[IMAGENETTE_SIZE]
    base = _find_folder(extracted, Path(url).name.split(".")[0], Path(url).name)
    counts, made = dict.fromkeys(LAYOUT_SPLITS, 0), set()
    for official, ours in (("train", "train"), ("val", "test")):
        if not (base / official).is_dir():
            raise ArchiveError(f"no {official}/ folder in {base}; give torchvision's {Path(url).name}")
        for class_folder in sorted(p for p in (base / official).iterdir() if p.is_dir()):
            class_name = Imagenette._WNID_TO_CLASS.get(class_folder.name, (class_folder.name,))[0].replace(" ", "_")
            files = sorted(p for p in class_folder.iterdir() if p.is_file())
            valid = carve_out([p.name for p in files], "imagenette") if official == "train" else set()
            for path in files:
                split = "valid" if path.name in valid else ours
                os.replace(path, _make_parent(layout / split / class_name / path.name, made))
                counts[split] += 1
    return counts


# --- get: the whole job, never half-done -------------------------------------------------------

def read_manifest(folder: Path) -> dict | None:
    """The manifest of a finished layout in `folder`, or None when there is none (or it is no JSON object)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def get(name: str, root: str | os.PathLike | None = None, archive: str | os.PathLike | None = None, *,
        progress: bool = True, say: Callable[[str], None] = print, timeout: float = TIMEOUT_SECONDS) -> Result:
    """Download (or take `archive`, a file the user already has) the release `name`, check its md5 and
    lay it out in `root` (default data_cache/<name>/). A finished layout is left as it is; two runs
    for the same folder take turns (build_lock.exclusive_build), the second finding the first's layout."""
    spec = release(name)
    target = resolve_path(root) if root else default_folder(name)
    source = None
    if archive is not None:
        source = resolve_path(archive)
        if source.is_dir():
            raise ArchiveError(f"--from {archive} is a folder; give the path of the archive file {spec.filename} itself")
        if source.exists() and not source.is_file():
            raise ArchiveError(f"--from {archive} is not a regular file (a FIFO, a device or a socket); give the path "
                               f"of the archive file {spec.filename}")
        if not source.is_file():
            raise FileNotFoundError(f"--from {archive}: no such file; give the path of {spec.filename}")
    _refuse_tracked_folder(target, name)
    staging = target.parent / f".partial-{target.name}"
    _refuse_link(staging)
    if read_manifest(target) is None:
        check_writable(target.parent, "--root another folder")
    with exclusive_build(target.parent / f".{target.name}"):  # the lock file: a hidden .<name>.lock beside it
        manifest = read_manifest(target)
        if manifest is not None:
            if manifest.get("dataset") != spec.title:
                raise FileExistsError(f"{target} holds the layout of {manifest.get('dataset')!r}, not {spec.title}; "
                                      f"pass --root another folder for {spec.name}")
            counts = manifest.get("counts")
            return Result(name, target, counts if isinstance(counts, dict) else {}, already_done=True)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise FileExistsError(f"{target} exists but holds no finished `workbook data get` (no {MANIFEST}); "
                                  "move it away, or pass --root another folder")
        staging.mkdir(exist_ok=True)
        try:
            counts = _get_into(spec, target, staging, source, progress, say, timeout)
        finally:
            if staging.is_dir() and not any(staging.iterdir()):
                staging.rmdir()  # nothing to resume: leave no empty staging folder behind
    result = Result(name, target, counts)
    if sum(counts.values()) != spec.images:
        result.warning = (f"warning: {sum(counts.values()):,} images laid out, but the {spec.title} release has "
                          f"{spec.images:,}; this archive is not the full release")
    return result


def _get_into(spec: Release, target: Path, staging: Path, source: Path | None, progress: bool,
              say: Callable[[str], None], timeout: float) -> dict:
    """The archive (downloaded into `staging`, or `source`) checked, laid out in staging/layout and
    renamed to `target` with its manifest; the staging folder removed. Returns images per split."""
    downloaded = source is None
    if downloaded:
        source = staging / spec.filename
        if source.exists():
            say(f"{spec.name}: checking the archive an earlier run downloaded ({source})")
        else:
            say(f"{spec.name}: downloading {spec.url}")
            fetch(spec.url, source, spec.name, progress=progress, timeout=timeout)
    found = md5_of(source)
    if found != spec.md5 and downloaded:
        source.unlink()  # a corrupt download must not be resumed; the next run starts afresh
        raise ArchiveError(f"{source} (downloaded from {spec.url}) has md5 {found}, expected {spec.md5}; "
                           "removed it: run the same command again to download afresh")
    if found != spec.md5:
        raise ArchiveError(f"{source} has md5 {found}, expected {spec.md5}: it is not the release's archive "
                           f"(cut short or altered); fetch it again from {spec.url}")
    counts = _lay_out(spec, source, staging, say, progress)
    layout = staging / "layout"
    (layout / MANIFEST).write_text(json.dumps({
        "dataset": spec.title, "url": spec.url, "md5": spec.md5, "archive": str(source), "counts": counts,
        "split": "fixed_splits.py: " + ("the committed EuroSAT split" if spec.name == "eurosat" else
                                        "the official test set; valid = a tenth of each train class (carve_out)"),
        "written": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")
    if target.is_dir():
        target.rmdir()  # empty (checked by get): a rename cannot replace a folder
    os.rename(layout, target)
    shutil.rmtree(staging, ignore_errors=True)  # the downloaded archive and what is left of its extraction
    return counts


def _lay_out(spec: Release, archive: Path, staging: Path, say: Callable[[str], None], progress: bool) -> dict:
    """Extract `archive` into staging/extracted and lay it out in staging/layout, each emptied first
    (what an interrupted earlier run left there is redone, not trusted)."""
    extracted, layout = staging / "extracted", staging / "layout"
    for folder in (staging, extracted, layout):
        _refuse_link(folder)
    for folder in (extracted, layout):
        shutil.rmtree(folder, ignore_errors=True)
    say(f"{spec.name}: extracting {archive.name} and laying it out as train/ valid/ test/")
    try:
        try:
            extract_safely(archive, extracted)
        except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile, tarfile.TarError) as error:
            if isinstance(error, ArchiveError) or getattr(error, "errno", None) in DISK_FULL:
                raise
            raise ArchiveError(f"cannot extract {archive} ({str(error).splitlines()[0]}); give {spec.filename} "
                               "as downloaded") from None
        layout.mkdir()
        counts = spec.lay_out(extracted, layout, progress)
    except BaseException as error:  # what a failed extraction wrote is removed: it would only fill the disk
        for folder in (extracted, layout):
            shutil.rmtree(folder, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            raise disk_full(extracted, unpacked_bytes(archive), f"the extracted {spec.filename}", ROOM_FIX) from None
        raise
    shutil.rmtree(extracted, ignore_errors=True)
    return counts


def unpacked_bytes(archive: Path) -> int:
    """The bytes an archive's files take once extracted (0 when it cannot be read)."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as handle:
                return sum(member.file_size for member in handle.infolist())
        with tarfile.open(archive) as handle:
            return sum(member.size for member in handle.getmembers() if member.isfile())
    except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError):
        return 0


def _refuse_tracked_folder(target: Path, name: str) -> None:
    """Refuse a layout inside the project where git would track it (`--root notebooks/eurosat`: 27,000 images one
    `git add .` from the history): a folder git ignores (without git: data_cache/ or runs/) or none of the project."""
    import subprocess

    root = project_root().resolve()
    try:
        inside = target.resolve().relative_to(root)
    except ValueError:
        return  # outside the project: not git's business
    if not is_project(root):
        return  # installed without the project: the current folder is the user's own
    try:
        answer = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", "--no-index", str(inside / MANIFEST)],
                                capture_output=True, timeout=30).returncode
    except (OSError, subprocess.TimeoutExpired):
        answer = 128
    ignored = answer == 0 if answer in (0, 1) else inside.parts[:1] in (("data_cache",), ("runs",))
    if not ignored:
        raise ArchiveError(f"--root {target} is inside the project, in a folder git does not ignore: its images "
                           f"would be one `git add` away from the history; use the default (data_cache/{name}) or "
                           "a folder outside the project")


def _refuse_link(folder: Path) -> None:
    """A staging folder must be a real folder: through a planted link, emptying it would delete another
    folder's files."""
    if folder.is_symlink():
        raise ArchiveError(f"{folder} is a symbolic link, not the staging folder `data get` makes; remove the link "
                           f"(rm {shlex.quote(str(folder))}) and run the same command again")


def _outside(name: str) -> bool:
    """Whether an archive member's path would land outside the folder it is extracted into."""
    posix = name.replace("\\", "/")
    return posix.startswith("/") or (len(posix) > 1 and posix[1] == ":") or ".." in PurePosixPath(posix).parts


def extract_safely(archive: Path, folder: Path) -> None:
    """Extract a .zip or tar archive into `folder`, past the md5 as well: a member whose path is absolute or climbs out
    with `..`, a link, a device file or a name that comes twice is an ArchiveError naming it (tar: also PEP 706's
    `filter="data"`), so nothing is written outside `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    seen = set()

    def check(name: str, kind_refused: str, overwrites: bool) -> None:
        why = ("would be written outside the folder" if _outside(name) else kind_refused
               or ("comes twice (the second would overwrite the first)" if overwrites and name in seen else ""))
        if why:
            raise ArchiveError(f"{archive.name}: member {name!r} {why}; this is not the release as published")
        seen.add(name)

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as handle:
            for member in handle.infolist():
                check(member.filename, "is a symbolic link" if stat.S_ISLNK(member.external_attr >> 16) else "", True)
            handle.extractall(folder)
        return
    with tarfile.open(archive) as handle:
        for member in handle.getmembers():
            kind_refused = "is a link" if member.issym() or member.islnk() else (
                "" if member.isfile() or member.isdir() else "is neither a file nor a folder")
            check(member.name, kind_refused, member.isfile())
        handle.extractall(folder, filter="data")
