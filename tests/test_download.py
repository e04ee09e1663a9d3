"""`workbook data get` without the network: a loopback HTTP server (127.0.0.1, a random port, stopped
after each test) serves tiny fake archives in the real layouts, with torchvision's URLs and md5s
patched to point at it: the download and its progress bar, the md5 check, a connection cut
mid-file and the resumed retry, the layouts and their splits, `--from FILE`, and the one-line
messages when offline."""
import hashlib
import http.server
import inspect
import io
import os
import pickle
import re
import socket
import tarfile
import threading
import time
import zipfile

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import CIFAR10, EuroSAT, Imagenette

from course_lib import cli
from course_lib.data import download
from course_lib.data.fixed_splits import EUROSAT_CLASS_COUNTS, load_eurosat_split, valid_count

pytestmark = pytest.mark.timeout(120)
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


# --- fake archives -----------------------------------------------------------------------------

def _jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def _eurosat_names():
    """Per class two train, one valid and one test image of the committed split."""
    by_class = {}
    for name, split in load_eurosat_split().items():
        picks = by_class.setdefault(name.rsplit("_", 1)[0], {"train": [], "valid": [], "test": []})
        if len(picks[split]) < (2 if split == "train" else 1):
            picks[split].append(name)
    return {name: split for picks in by_class.values() for split, names in picks.items() for name in names}


@pytest.fixture(scope="module")
def eurosat_zip():
    """(zip bytes, {file name: split}) in torchvision's layout: 2750/<Class>/<Class>_<n>.jpg."""
    names = _eurosat_names()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for seed, name in enumerate(sorted(names)):
            archive.writestr(f"2750/{name.rsplit('_', 1)[0]}/{name}", _jpeg(seed))
    return buffer.getvalue(), names


def _add(archive: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    archive.addfile(info, io.BytesIO(payload))


@pytest.fixture(scope="module")
def cifar_tarball():
    """(tar.gz bytes, train images, train labels) in the real format: cifar-10-batches-py/ with five
    training batches of 40 images (4 per class), a test batch of 30 and batches.meta, pickled."""
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    train_pixels, train_labels = [], []
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for batch in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
            labels = [int(v) for v in rng.permutation(np.repeat(np.arange(10), 3 if batch == "test_batch" else 4))]
            data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
            if batch != "test_batch":
                train_pixels.append(data)
                train_labels += labels
            _add(archive, f"cifar-10-batches-py/{batch}", pickle.dumps(
                {"batch_label": batch, "labels": labels, "data": data,
                 "filenames": [f"{i}.png" for i in range(len(labels))]}, protocol=2))
        _add(archive, "cifar-10-batches-py/batches.meta",
             pickle.dumps({"label_names": CIFAR_CLASSES, "num_cases_per_batch": 40, "num_vis": 3072}, protocol=2))
    return buffer.getvalue(), np.concatenate(train_pixels), train_labels


class FakeServer:
    """Files by URL path; honours Range; `cut_once` paths send half their bytes, then close; `trickle` paths send
    one byte every so many seconds."""

    def __init__(self):
        self.files, self.cut_once, self.requests, self.trickle = {}, set(), [], {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                owner.requests.append((self.path, self.headers.get("Range")))
                payload = owner.files.get(self.path)
                if payload is None:
                    self.send_error(404)
                    return
                start = 0
                wanted = self.headers.get("Range")
                if wanted:
                    start = int(wanted.removeprefix("bytes=").split("-")[0])
                    if start >= len(payload):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(payload) - 1}/{len(payload)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(payload) - start))
                self.end_headers()
                body = payload[start:]
                if self.path in owner.cut_once:
                    owner.cut_once.discard(self.path)
                    body = body[:len(body) // 2]
                if self.path in owner.trickle:
                    try:
                        for index in range(len(body)):
                            self.wfile.write(body[index:index + 1])
                            self.wfile.flush()
                            time.sleep(owner.trickle[self.path])
                    except (BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
                        pass
                    return
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):  # keep the test output clean
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"


@pytest.fixture
def server():
    fake = FakeServer()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    fake.thread.join(timeout=5)


@pytest.fixture
def closed_port():
    """A loopback port nothing listens on (bound, then released): connecting is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve_eurosat(server, monkeypatch, payload, md5=None):
    server.files["/EuroSAT.zip"] = payload
    monkeypatch.setattr(download, "EUROSAT_URL", server.url("/EuroSAT.zip"))
    monkeypatch.setattr(download, "EUROSAT_MD5", md5 or hashlib.md5(payload).hexdigest())


def _run(capsys, *argv):
    code = cli.main(["data", "get", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _error_line(err: str) -> str:
    """The CLI's one-line error: the last line of stderr (a progress bar may come before it)."""
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines and lines[-1].startswith("workbook data: error: "), err
    return lines[-1]


def _layout(folder):
    return {path.name: path.parts[-3] for path in folder.glob("*/*/*") if path.is_file()}


# --- the tests ---------------------------------------------------------------------------------

def test_the_urls_and_md5s_are_torchvisions():
    source = inspect.getsource(EuroSAT.download)
    assert download.EUROSAT_URL in source and download.EUROSAT_MD5 in source
    assert (download.release("cifar10").url, download.release("cifar10").md5) == (CIFAR10.url, CIFAR10.tgz_md5)
    assert download.release("imagenette").url == Imagenette._ARCHIVES["160px"][0]
    assert download.default_folder("eurosat").parts[-2:] == ("data_cache", "eurosat")
    assert download.DOWNLOADABLE == ("eurosat", "cifar10", "imagenette")


def test_eurosat_downloads_with_progress_into_the_committed_split_once(server, monkeypatch, capsys, tmp_path,
                                                                       eurosat_zip):
    payload, names = eurosat_zip
    _serve_eurosat(server, monkeypatch, payload)
    root = tmp_path / "data" / "eurosat"
    code, out, err = _run(capsys, "eurosat", "--root", str(root))
    assert code == 0, err
    assert f"eurosat: laid out 40 images in {root} (train 20, valid 10, test 10)" in out
    assert "EuroSAT.zip" in err and "100%" in err  # tqdm's bar, on stderr
    assert "warning: 40 images laid out, but the EuroSAT RGB release has 27,000" in err
    assert _layout(root) == names  # each image in the split the committed file gives it
    assert sorted(p.name for p in root.iterdir()) == ["MANIFEST.json", "test", "train", "valid"]
    assert sorted(p.name for p in (root / "train").iterdir()) == sorted(EUROSAT_CLASS_COUNTS)
    assert sorted(p.name for p in root.parent.iterdir()) == [".eurosat.lock", "eurosat"]  # no staging folder left
    asked = len(server.requests)
    code, out, err = _run(capsys, "eurosat", "--root", str(root))
    assert code == 0
    assert out.strip() == f"eurosat: already laid out in {root} (train 20, valid 10, test 10); nothing to do"
    assert len(server.requests) == asked  # nothing downloaded again


def test_a_corrupted_download_is_refused_in_one_line_and_not_resumed(server, monkeypatch, capsys, tmp_path,
                                                                     eurosat_zip):
    payload, _ = eurosat_zip
    good_md5 = hashlib.md5(payload).hexdigest()
    corrupted = payload[:100] + bytes([payload[100] ^ 0xFF]) + payload[101:]
    _serve_eurosat(server, monkeypatch, corrupted, md5=good_md5)
    root = tmp_path / "eurosat"
    code, _, err = _run(capsys, "eurosat", "--root", str(root))
    line = _error_line(err)
    assert code == 2
    assert f"has md5 {hashlib.md5(corrupted).hexdigest()}, expected {good_md5}" in line and "EuroSAT.zip" in line
    assert not root.exists() and not (tmp_path / ".partial-eurosat" / "EuroSAT.zip").exists()
    server.files["/EuroSAT.zip"] = payload  # the server is fixed: the next run downloads afresh
    code, out, err = _run(capsys, "eurosat", "--root", str(root))
    assert code == 0 and "laid out 40 images" in out, err


def test_a_cut_connection_fails_in_one_line_and_the_retry_resumes(server, monkeypatch, capsys, tmp_path, eurosat_zip):
    payload, names = eurosat_zip
    _serve_eurosat(server, monkeypatch, payload)
    server.cut_once.add("/EuroSAT.zip")
    root = tmp_path / "eurosat"
    code, _, err = _run(capsys, "eurosat", "--root", str(root))
    line = _error_line(err)
    assert code == 2 and "stopped after" in line and "run the same command again to resume" in line
    part = tmp_path / ".partial-eurosat" / "EuroSAT.zip.part"
    assert part.stat().st_size == len(payload) // 2
    assert not root.exists()  # a cut download never counts as done
    code, out, err = _run(capsys, "eurosat", "--root", str(root))
    assert code == 0, err
    assert server.requests[-1] == ("/EuroSAT.zip", f"bytes={len(payload) // 2}-")  # resumed, not restarted
    assert _layout(root) == names


def test_a_half_finished_layout_is_redone_and_a_foreign_folder_is_left_alone(server, monkeypatch, capsys, tmp_path,
                                                                             eurosat_zip):
    payload, names = eurosat_zip
    _serve_eurosat(server, monkeypatch, payload)
    staging = tmp_path / ".partial-eurosat"
    (staging / "layout" / "train" / "Forest").mkdir(parents=True)  # what an interrupted run left
    (staging / "layout" / "train" / "Forest" / "stale.jpg").write_bytes(b"stale")
    (staging / "EuroSAT.zip").write_bytes(payload)  # downloaded and complete: reused, not fetched again
    code, out, err = _run(capsys, "eurosat", "--root", str(tmp_path / "eurosat"))
    assert code == 0, err
    assert "checking the archive an earlier run downloaded" in out and not server.requests
    assert _layout(tmp_path / "eurosat") == names
    mine = tmp_path / "mine"
    (mine / "train").mkdir(parents=True)
    code, _, err = _run(capsys, "eurosat", "--root", str(mine))
    assert code == 2 and "exists but holds no finished `workbook data get`" in _error_line(err)
    assert (mine / "train").is_dir()


def test_cifar10_pngs_with_a_stratified_stable_carve_out(server, monkeypatch, capsys, tmp_path, cifar_tarball):
    payload, train_pixels, train_labels = cifar_tarball
    server.files["/cifar-10-python.tar.gz"] = payload
    monkeypatch.setattr(CIFAR10, "url", server.url("/cifar-10-python.tar.gz"))
    monkeypatch.setattr(CIFAR10, "tgz_md5", hashlib.md5(payload).hexdigest())
    layouts = []
    for copy in ("first", "second"):
        code, out, err = _run(capsys, "cifar10", "--root", str(tmp_path / copy), "--no-progress")
        assert code == 0, err
        assert "laid out 230 images" in out and "(train 180, valid 20, test 30)" in out
        layouts.append(_layout(tmp_path / copy))
    assert layouts[0] == layouts[1]  # everyone gets the same carve-out
    valid = [name for name, split in layouts[0].items() if split == "valid"]
    per_class = {c: len(list((tmp_path / "first" / "valid" / c).iterdir())) for c in CIFAR_CLASSES}
    assert per_class == dict.fromkeys(CIFAR_CLASSES, valid_count(20))
    assert all(name.startswith("train_") for name in valid)
    index = int(valid[0].removeprefix("train_").removesuffix(".png"))
    label = CIFAR_CLASSES[train_labels[index]]
    written = np.asarray(Image.open(tmp_path / "first" / "valid" / label / valid[0]))
    assert np.array_equal(written, train_pixels[index].reshape(3, 32, 32).transpose(1, 2, 0))


def test_from_file_imports_an_archive_and_refuses_a_wrong_one(monkeypatch, capsys, tmp_path, eurosat_zip,
                                                             closed_port):
    payload, names = eurosat_zip
    monkeypatch.setattr(download, "EUROSAT_URL", f"http://127.0.0.1:{closed_port}/EuroSAT.zip")
    monkeypatch.setattr(download, "EUROSAT_MD5", hashlib.md5(payload).hexdigest())
    wrong = tmp_path / "EuroSAT (1).zip"
    wrong.write_bytes(payload[:-10])
    code, _, err = _run(capsys, "eurosat", "--root", str(tmp_path / "eurosat"), "--from", str(wrong))
    assert code == 2 and f"{wrong} has md5 {hashlib.md5(payload[:-10]).hexdigest()}, expected" in _error_line(err)
    assert wrong.exists()  # the user's file is never removed
    code, _, err = _run(capsys, "eurosat", "--from", str(tmp_path / "missing.zip"))
    assert code == 2 and "--from" in _error_line(err) and "no such file" in err
    archive = tmp_path / "EuroSAT.zip"
    archive.write_bytes(payload)
    code, out, err = _run(capsys, "eurosat", "--root", str(tmp_path / "eurosat"), "--from", str(archive))
    assert code == 0, err
    assert _layout(tmp_path / "eurosat") == names and archive.read_bytes() == payload


def test_imagenette_from_file_gets_readable_classes_and_a_tenth_for_validation(monkeypatch, capsys, tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for official, count in (("train", 20), ("val", 5)):
            for wnid in ("n01440764", "n02102040"):
                for i in range(count):
                    _add(archive, f"imagenette2-160/{official}/{wnid}/{wnid}_{official}{i}.JPEG", _jpeg(i))
    payload = buffer.getvalue()
    url, _ = Imagenette._ARCHIVES["160px"]
    monkeypatch.setitem(Imagenette._ARCHIVES, "160px", (url, hashlib.md5(payload).hexdigest()))
    (tmp_path / "imagenette2-160.tgz").write_bytes(payload)
    code, out, err = _run(capsys, "imagenette", "--root", str(tmp_path / "nette"), "--from",
                          str(tmp_path / "imagenette2-160.tgz"))
    assert code == 0, err
    assert "(train 36, valid 4, test 10)" in out
    assert sorted(p.name for p in (tmp_path / "nette" / "valid").iterdir()) == ["English_springer", "tench"]


def test_offline_is_one_line_naming_the_url_and_from(monkeypatch, capsys, tmp_path, closed_port):
    url = f"http://127.0.0.1:{closed_port}/EuroSAT.zip"
    monkeypatch.setattr(download, "EUROSAT_URL", url)
    code, out, err = _run(capsys, "eurosat", "--root", str(tmp_path / "eurosat"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    line = _error_line(err)
    assert f"cannot download {url} (Connection refused)" in line
    assert "`workbook data get eurosat --from EuroSAT.zip`" in line
    assert [p.name for p in tmp_path.iterdir()] == [".eurosat.lock"]  # no layout, no empty staging folder


@pytest.mark.parametrize("dataset", ["eurosat", "cifar10"])
def test_torchvision_download_true_offline_is_one_line(dataset, monkeypatch, capsys, tmp_path, closed_port):
    """-p dataset=eurosat|cifar10 -p download=true without a network: one line, not a traceback."""
    from torchvision.datasets import eurosat, utils

    def refused(url, *args, **kwargs):  # torchvision's own download code, pointed at a closed port
        return utils.download_and_extract_archive(f"http://127.0.0.1:{closed_port}/{url.rsplit('/', 1)[1]}",
                                                  *args, **kwargs)

    monkeypatch.setattr(eurosat, "download_and_extract_archive", refused)
    monkeypatch.setattr(CIFAR10, "url", f"http://127.0.0.1:{closed_port}/cifar-10-python.tar.gz")
    code = cli.main(["data", "info", "--profile", "cpu", "-p", f"dataset={dataset}", "-p", "download=true",
                     "-p", f"data_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "cannot download" in err and f"workbook data get {dataset} --from" in err


# --- past the md5: archives that try to write outside their folder (issue 49, point 12) ---------------

def _zip_with(*members) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member in members:
            if isinstance(member, zipfile.ZipInfo):
                archive.writestr(member, b"target")
            else:
                archive.writestr(member, b"x")
    return buffer.getvalue()


def _link_member(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (0o120777 << 16)  # S_IFLNK: a symbolic link, as `zip --symlinks` stores it
    return info


@pytest.mark.parametrize("members,why", [
    (["2750/Forest/Forest_1.jpg", "../../escaped.jpg"], "would be written outside the folder"),
    (["/tmp/absolute.jpg"], "would be written outside the folder"),
    (["2750/Forest/Forest_1.jpg", "2750/Forest/Forest_1.jpg"], "comes twice"),
    ([_link_member("2750/Forest/Forest_2.jpg")], "is a symbolic link"),
])
def test_a_zip_whose_members_escape_link_or_repeat_is_refused_naming_the_member(monkeypatch, capsys, tmp_path,
                                                                                members, why):
    payload = _zip_with(*members)
    monkeypatch.setattr(download, "EUROSAT_MD5", hashlib.md5(payload).hexdigest())  # past the md5 check
    code, line = _get_from(capsys, tmp_path, "eurosat", "EuroSAT.zip", payload)
    assert code == 2 and "EuroSAT.zip: member" in line and why in line, line
    assert not (tmp_path / "escaped.jpg").exists() and not (tmp_path / "data" / "eurosat").exists()


def _get_from(capsys, tmp_path, dataset: str, name: str, payload: bytes) -> tuple[int, str]:
    """`data get DATASET --from` an archive `name` holding `payload`, into tmp_path/data/DATASET:
    (exit code, its error line)."""
    archive = tmp_path / "given" / name
    archive.parent.mkdir()
    archive.write_bytes(payload)
    code, _, err = _run(capsys, dataset, "--root", str(tmp_path / "data" / dataset), "--from", str(archive))
    return code, _error_line(err)


def _tar_with(tmp_path, build) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        build(archive)
    return buffer.getvalue()


def _symlink(archive, name, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    archive.addfile(info)


@pytest.mark.parametrize("build,why", [
    (lambda a: _add(a, "../escaped", b"x"), "would be written outside the folder"),
    (lambda a: _add(a, "/tmp/workbook-absolute-member", b"x"), "would be written outside the folder"),
    (lambda a: _symlink(a, "cifar-10-batches-py", "/etc"), "is a link"),
    (lambda a: (_add(a, "cifar-10-batches-py/batches.meta", b"x"), _add(a, "cifar-10-batches-py/batches.meta", b"y")),
     "comes twice"),
])
def test_a_tarball_whose_members_escape_link_or_repeat_is_refused_naming_the_member(monkeypatch, capsys, tmp_path,
                                                                                    build, why):
    payload = _tar_with(tmp_path, build)
    monkeypatch.setattr(CIFAR10, "tgz_md5", hashlib.md5(payload).hexdigest())
    code, line = _get_from(capsys, tmp_path, "cifar10", "cifar-10-python.tar.gz", payload)
    assert code == 2 and "cifar-10-python.tar.gz: member" in line and why in line, line
    assert not (tmp_path / "data" / "escaped").exists() and not (tmp_path / "escaped").exists()


def test_a_cifar_batch_that_names_a_function_is_refused_before_it_is_called(monkeypatch, capsys, tmp_path):
    """Past the md5, a pickle could call anything it names (os.system): the batches are read by an unpickler
    that admits numpy's arrays and nothing else."""
    planted = tmp_path / "planted"

    class Exploit:
        def __reduce__(self):
            return (os.makedirs, (str(planted),))

    payload = _tar_with(tmp_path, lambda a: _add(a, "cifar-10-batches-py/batches.meta", pickle.dumps(Exploit())))
    monkeypatch.setattr(CIFAR10, "tgz_md5", hashlib.md5(payload).hexdigest())
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(payload)
    code, _, err = _run(capsys, "cifar10", "--root", str(tmp_path / "cifar10"), "--from", str(archive))
    line = _error_line(err)
    assert code == 2 and "cannot read the CIFAR-10 batch" in line and "which a CIFAR-10 batch never holds" in line
    assert not planted.exists()


def test_a_planted_staging_link_is_refused_and_the_folder_it_points_to_kept(monkeypatch, capsys, tmp_path, eurosat_zip):
    payload, _ = eurosat_zip
    monkeypatch.setattr(download, "EUROSAT_MD5", hashlib.md5(payload).hexdigest())
    archive = tmp_path / "EuroSAT.zip"
    archive.write_bytes(payload)
    precious = tmp_path / "precious"
    (precious / "extracted").mkdir(parents=True)
    (precious / "extracted" / "keep.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ".partial-eurosat").symlink_to(precious)
    code, _, err = _run(capsys, "eurosat", "--root", str(tmp_path / "data" / "eurosat"), "--from", str(archive))
    line = _error_line(err)
    assert code == 2 and ".partial-eurosat is a symbolic link" in line and "rm " in line
    assert (precious / "extracted" / "keep.txt").read_text() == "mine"


def test_from_a_folder_or_a_fifo_says_what_it_is_not_no_such_file(capsys, tmp_path):
    (tmp_path / "EuroSAT.zip").mkdir()
    code, _, err = _run(capsys, "eurosat", "--root", str(tmp_path / "e"), "--from", str(tmp_path / "EuroSAT.zip"))
    assert code == 2 and "is a folder; give the path of the archive file EuroSAT.zip itself" in _error_line(err)
    fifo = tmp_path / "pipe.zip"
    os.mkfifo(fifo)
    code, _, err = _run(capsys, "eurosat", "--root", str(tmp_path / "e"), "--from", str(fifo))
    assert code == 2 and "is not a regular file (a FIFO" in _error_line(err)


def test_another_datasets_layout_is_not_taken_for_this_one(capsys, tmp_path):
    """`data get cifar10 --root <a EuroSAT layout>` once said "already laid out, nothing to do"."""
    folder = tmp_path / "eurosat"
    folder.mkdir()
    (folder / download.MANIFEST).write_text('{"dataset": "EuroSAT RGB", "counts": {"train": 1}}')
    code, _, err = _run(capsys, "cifar10", "--root", str(folder))
    assert code == 2 and "holds the layout of 'EuroSAT RGB', not CIFAR-10" in _error_line(err)
    code, out, _ = _run(capsys, "eurosat", "--root", str(folder))
    assert code == 0 and "already laid out" in out
    (folder / download.MANIFEST).write_text('["a list"]')  # not a manifest: no finished layout, and a foreign folder
    code, _, err = _run(capsys, "eurosat", "--root", str(folder))
    assert code == 2 and "holds no finished `workbook data get`" in _error_line(err)


@pytest.mark.parametrize("limit, says", [({"stall_seconds": 0.5}, r"stalled: \d+ bytes in the last \d+ s"),
                                         ({"deadline_seconds": 0.5}, r"still running after 0\.5 s, the most a download may take")])
def test_a_trickling_server_is_stopped_in_one_line_and_the_part_kept(server, tmp_path, limit, says):
    """Issue 49 point 7: one byte every 1.5 s never tripped the per-read timeout, so the download never ended."""
    server.files["/slow.zip"] = bytes(10_000)
    server.trickle["/slow.zip"] = 0.02
    started = time.monotonic()
    with pytest.raises(download.DownloadError, match=rf"stopped after 0\.0 of 0\.0 MB \({says}\); the part is kept "
                                                     r"in .*slow\.zip\.part: run the same command again to resume"):
        download.fetch(server.url("/slow.zip"), tmp_path / "slow.zip", "eurosat", progress=False, **limit)
    assert time.monotonic() - started < 10 and (tmp_path / "slow.zip.part").stat().st_size > 0


def test_a_full_disk_while_downloading_is_one_line_and_removes_the_part(server, small_disk):
    """Issue 49 point 7: ENOSPC mid-download was a 22-line traceback, and the .part stayed, keeping the disk full."""
    from course_lib.data.build_lock import DiskFullError

    server.files["/big.zip"] = os.urandom(12 * 2**20)  # 12 MiB on an 8 MiB disk
    with pytest.raises(DiskFullError, match=r"no room on the disk for the download of big\.zip: 12\.0 MiB needed "
                                            r"at .*; free some space there, or pass --root a folder on another disk"):
        download.fetch(server.url("/big.zip"), small_disk / "big.zip", "eurosat", progress=False)
    assert not list(small_disk.iterdir())


def test_a_full_disk_while_extracting_is_one_line_and_leaves_no_files(monkeypatch, tmp_path, small_disk, capsys):
    """Issue 49 point 7: a failed extraction left its files behind and advised giving the archive as downloaded."""
    archive = tmp_path / "EuroSAT.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as handle:
        handle.writestr("2750/Forest/Forest_1.jpg", bytes(12 * 2**20))  # 12 MiB once extracted, a few KB packed
    monkeypatch.setattr(download, "EUROSAT_MD5", hashlib.md5(archive.read_bytes()).hexdigest())
    code, out, err = _run(capsys, "eurosat", "--root", str(small_disk / "eurosat"), "--from", str(archive))
    assert code != 0
    assert re.search(r"no room on the disk for the extracted EuroSAT\.zip: 12\.0 MiB needed at .*pass --root a folder "
                     r"on another disk$", _error_line(err)), err
    assert "as downloaded" not in err
    assert not [path for path in small_disk.rglob("*") if path.is_file() and not path.name.endswith(".lock")]


def test_a_layout_inside_the_project_where_git_would_track_it_is_refused(capsys, tmp_path, eurosat_zip):
    """Issue 49 point 14: `data get --root notebooks/eurosat` was accepted, 27,000 images one `git add` away from
    the history. The project's ignored folders (data_cache/, runs/) and folders outside it stay allowed."""
    from course_lib import paths

    archive = tmp_path / "EuroSAT.zip"
    archive.write_bytes(eurosat_zip[0])
    tracked = paths.project_root() / "notebooks" / "eurosat-test-layout"
    code, out, err = _run(capsys, "eurosat", "--root", str(tracked), "--from", str(archive))
    assert code != 0 and not tracked.exists()
    assert re.search(r"--root .*notebooks/eurosat-test-layout is inside the project, in a folder git does not "
                     r"ignore: .*use the default \(data_cache/eurosat\) or a folder outside the project$",
                     _error_line(err)), err
    download._refuse_tracked_folder(paths.project_root() / "data_cache" / "eurosat", "eurosat")  # ignored: fine
    download._refuse_tracked_folder(tmp_path / "eurosat", "eurosat")  # outside the project: fine
