"""Where things live: the project root, the committed sample, the data cache, the runs folder, the real EuroSAT copy
beside the project, and the one rule for which data a run uses (`choose_data`). A leaf: it imports nothing of the
project, so every module can ask for a path without pulling in datasets or the ledger.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

SAMPLE_DIR = Path("data_samples") / "landcover-synth"  # the committed landcover-synth sample
CACHE_DIR = Path("data_cache")  # generated or downloaded data, pre-decoded caches (not committed)
RUNS_DIR = Path("runs")  # executed notebooks, checkpoints, evaluations, the ledger (not committed)


PACKAGE_DIR = Path(__file__).resolve().parent  # course_lib/ itself


class NotWritableError(OSError):
    """A folder the run must write to cannot be created or written; the message says which and why."""


class FolderInUseError(NotWritableError):
    """Another run holds the output folder (`OutputLock`); the message names its process."""


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed into place: a reader (a browser refreshing the
    page) or a crash never sees half a file, and a write that failed (a full disk) leaves no temporary behind."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (signal 0 only asks; one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputLock:
    """An exclusive lock on an output folder for one run, so two `workbook train` runs on one
    `output_dir` cannot both write `last.pt` (each would record a checkpoint holding the other's
    weights). An advisory POSIX lock (fcntl.flock) on `<folder>/.workbook-run.lock`, which says who
    holds it: the kernel drops the lock when its process dies, so a lock file left by a killed
    run is simply taken over; a finished run removes it. Where there is no fcntl (Windows), no lock."""

    NAME = ".workbook-run.lock"
    ATTEMPTS = 10  # a holder removing its file as another run opens it sends that run round again

    def __init__(self, folder: str | os.PathLike, what: str = "workbook train"):
        self.folder, self.what, self._handle = resolve_path(folder), what, None

    def acquire(self) -> OutputLock:
        """Take the lock, or raise FolderInUseError naming the holder's PID."""
        try:
            import fcntl
        except ImportError:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / self.NAME
        for _ in range(self.ATTEMPTS):
            # "a+", not "w": the holder's line must survive a failed attempt. Kept open: the open file holds the lock.
            handle = open(path, "a+")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "a process that has not written its PID yet"
                handle.close()
                raise FolderInUseError(f"{self.folder} is in use by another run ({holder}); wait for it to end, "
                                       "or set output_dir to another folder") from None
            try:
                current = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            handle.close()  # locked a file its finishing holder had just removed: lock the new one
        else:
            raise FolderInUseError(f"{self.folder}: its lock file {self.NAME} keeps being replaced; "
                                   "is another run starting and stopping there?")
        handle.seek(0)
        handle.truncate()
        handle.write(f"PID {os.getpid()} on {socket.gethostname()}, {self.what}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        """Remove the lock file, then drop the lock (in that order: a run that opened the old file
        meanwhile sees that it was removed and locks a new one)."""
        if self._handle is not None:
            import fcntl

            try:
                (self.folder / self.NAME).unlink()
            except FileNotFoundError:
                pass
            # Unlock before closing: DataLoader workers forked during the run share this open file,
            # and a close alone would leave the lock held until the last of them exits.
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def is_project(folder: Path) -> bool:
    """Whether `folder` is this project's checkout (pyproject.toml beside course_lib/)."""
    return (folder / "pyproject.toml").exists() and (folder / "course_lib").is_dir()


def project_root() -> Path:
    """The folder holding pyproject.toml (so a notebook kernel started in notebooks/ still
    writes to the project's runs/ folder). Outside any project, the project this package was
    installed from (the folder above course_lib/, for a source checkout or an editable install),
    so `workbook train --profile smoke` finds the committed sample from any folder; the current
    folder when the package is installed without its project."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if is_project(folder):
            return folder
    if is_project(PACKAGE_DIR.parent):
        return PACKAGE_DIR.parent
    return here


def check_writable(folder: str | os.PathLike, option: str = "-p output_dir=...") -> Path:
    """Create `folder` (relative paths: under the project root) and write and remove a probe file
    in it, so a run that will write there fails in its first second, not after an epoch.
    Returns the folder; raises NotWritableError (one line: the folder, the reason, the fix, naming `option`,
    the caller's own way to choose another folder)."""
    target = resolve_path(folder)
    probe = target / f".write-probe-{os.getpid()}"
    try:
        target.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"probe")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        reason = error.strerror or str(error)
        if isinstance(error, FileExistsError) or (target.exists() and not target.is_dir()):
            reason = "a file of that name is in the way"
        elif isinstance(error, NotADirectoryError):
            reason = "part of the path is a file, not a folder"
        failure = NotWritableError(f"cannot write to {target} ({reason}); choose a folder you can write "
                                   f"({option}) or fix its permissions")
        failure.errno = error.errno
        raise failure from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return target


def resolve_path(path: str | Path) -> Path:
    """Relative paths are relative to the project root, so notebooks (run from notebooks/)
    and the CLI agree."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else project_root() / candidate


def eurosat_shared_dir() -> Path | None:
    """The real EuroSAT RGB folder beside the project (../shared/datasets/eurosat_rgb), if present."""
    candidate = project_root().parent / "shared" / "datasets" / "eurosat_rgb"
    return candidate if (candidate / "train").is_dir() else None


DATA_ENV = "WORKBOOK_DATA"  # a folder of images every run uses, or "none" to hide all real data
NO_REAL_DATA = "none"  # the DATA_ENV value that hides every real dataset (the synthetic fallback then)
CACHED_DATASETS = ("eurosat", "cifar10", "imagenette")  # data_cache/<name>/: what `workbook data get NAME` writes
GET_REAL_DATA = "workbook data get eurosat"  # the command the synthetic fallback's line suggests


@dataclass(frozen=True)
class DataChoice:
    """What `choose_data` found: the Config overrides for it, and one line for a reader saying what
    the data is and where it came from."""

    overrides: dict  # Config fields: {"dataset": ..., "data_dir": ...}, or {} for the profile's own data
    name: str  # what the data is: "eurosat", "cifar10", a folder's name, "landcover-synth" ...
    origin: str  # how it was found (data_dir, WORKBOOK_DATA, data_cache/eurosat/ ...) or why it is synthetic
    synthetic: bool  # generated images (landcover-synth), not real ones
    folder: Path | None = None  # the folder read; None: the dataset's default place (landcover-synth: generated)

    @property
    def real(self) -> bool:
        return not self.synthetic

    @property
    def line(self) -> str:
        """One line naming the data and where it came from; on synthetic data, the command that gets real data."""
        if not self.synthetic:
            return f"data: {self.name}" + (f" ({self.folder})" if self.folder else "") + f", from {self.origin}"
        if self.folder is None:
            made = f"made in {CACHE_DIR}/ on first use"
        elif self.folder == resolve_path(SAMPLE_DIR):
            made = f"the committed sample {SAMPLE_DIR}"
        else:
            made = str(self.folder)
        return (f"data: {self.name} (SYNTHETIC generated images, {made}): {self.origin}; "
                f"for real data run `{GET_REAL_DATA}`")


def _data_env() -> str | None:
    """WORKBOOK_DATA's value: None when unset or empty, "none" to hide real data, else a folder
    (raises NotADirectoryError, one line, when it is not one)."""
    value = os.environ.get(DATA_ENV, "").strip()
    if not value:
        return None
    if value.lower() == NO_REAL_DATA:
        return NO_REAL_DATA
    if not resolve_path(value).is_dir():
        raise NotADirectoryError(f"{DATA_ENV}={value} is not a folder; set it to an image folder (train/ and valid/ "
                                 f"of class folders), to {NO_REAL_DATA} for the synthetic data, or unset it")
    return value


def _folder_choice(folder: str | Path, origin: str) -> DataChoice:
    """An image folder as the data; a landcover-synth copy (its dataset.json says so) counts as synthetic."""
    path = resolve_path(folder)
    try:
        synthetic = '"landcover-synth"' in (path / "dataset.json").read_text()
    except OSError:
        synthetic = False
    return DataChoice({"dataset": "imagefolder", "data_dir": str(path)}, "landcover-synth" if synthetic else path.name,
                      origin, synthetic, path)


def find_real_data(names: tuple[str, ...] = CACHED_DATASETS) -> DataChoice | None:
    """The real data this machine has, in the order every run looks: the WORKBOOK_DATA folder
    (WORKBOOK_DATA=none: nothing), then data_cache/<name>/ with a train/ folder for each of `names`,
    then EuroSAT beside the project (../shared/datasets/eurosat_rgb, when "eurosat" is in `names`)."""
    named = _data_env()
    if named == NO_REAL_DATA:
        return None
    if named:
        return _folder_choice(named, f"{DATA_ENV}={named}")
    for name in names:
        cached = project_root() / CACHE_DIR / name
        if (cached / "train").is_dir():
            return DataChoice({"dataset": "imagefolder", "data_dir": str(cached)}, name, f"{CACHE_DIR}/{name}/",
                              False, cached)
    shared = eurosat_shared_dir() if "eurosat" in names else None
    if shared is not None:
        return DataChoice({"dataset": "imagefolder", "data_dir": str(shared)}, "eurosat",
                          "../shared/datasets/eurosat_rgb beside the project", False, shared)
    return None


def eurosat_dir() -> Path | None:
    """The real EuroSAT folder found in `find_real_data`'s order (a WORKBOOK_DATA folder counts as
    the reader's word that it is the data to use), or None; for what is about EuroSAT itself."""
    found = find_real_data(("eurosat",))
    return found.folder if found is not None else None


GET_IMAGENETTE = "workbook data get imagenette"  # the command that lays Imagenette out in data_cache/imagenette/


def imagenette_dir() -> Path | None:
    """data_cache/imagenette/ when `workbook data get imagenette` has laid it out there (train/ and test/, the
    official val, which the leaderboard scores), else None; WORKBOOK_DATA=none hides it as it hides all real data.
    Only that folder: a WORKBOOK_DATA folder names the data of every run, not Imagenette."""
    if os.environ.get(DATA_ENV, "").strip().lower() == NO_REAL_DATA:
        return None
    folder = project_root() / CACHE_DIR / "imagenette"
    return folder if (folder / "train").is_dir() and (folder / "test").is_dir() else None


def choose_data(profile: str | None, data_dir: str | None = None, dataset: str | None = None, *,
                find_real: bool = True) -> DataChoice:
    """The one rule for "which data does this run use", for `workbook train`, `data info`, `speedrun`
    and the notebooks alike: an explicit `dataset` (with its `data_dir`) or `data_dir` wins; then a
    WORKBOOK_DATA folder; then, outside the smoke profile (CI-sized: it stays on the committed
    sample) and when `find_real`, data_cache/eurosat, cifar10 or imagenette, then EuroSAT beside the
    project; else the profile's own synthetic landcover-synth (the committed sample in smoke,
    generated on first use otherwise), whose line says how to get real data."""
    if dataset and not (dataset == "imagefolder" and data_dir):
        # without data_dir: the profile's (smoke: the committed sample) or the dataset's default place
        sample = dataset == "landcover-synth" and profile == "smoke"
        folder = resolve_path(data_dir) if data_dir else resolve_path(SAMPLE_DIR) if sample else None
        return DataChoice({"dataset": dataset, **({"data_dir": str(data_dir)} if data_dir else {})}, dataset,
                          "the dataset parameter", dataset == "landcover-synth", folder)
    if data_dir:
        return _folder_choice(data_dir, "the data_dir parameter")
    named = _data_env()
    if named and named != NO_REAL_DATA:
        return _folder_choice(named, f"{DATA_ENV}={named}")
    if profile != "smoke" and find_real and named != NO_REAL_DATA:
        found = find_real_data()
        if found is not None:
            return found
    if profile == "smoke":
        why = "the smoke profile stays on the committed sample"
    elif named == NO_REAL_DATA:
        why = f"{DATA_ENV}={NO_REAL_DATA} hides real data"
    elif not find_real:
        why = "this notebook uses the profile's own data"
    else:
        why = (f"no real data found in {DATA_ENV}, {', '.join(f'{CACHE_DIR}/{n}/' for n in CACHED_DATASETS)} "
               "or ../shared/datasets/eurosat_rgb")
    sample = resolve_path(SAMPLE_DIR) if profile == "smoke" else None
    return DataChoice({}, "landcover-synth", why, True, sample)
