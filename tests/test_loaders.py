import pytest
import torch

from course_lib.config import ConfigError, make_config
from course_lib.data import loaders
from course_lib.data.images import BadImageError
from course_lib.data.landcover import make_landcover

BAD_NAME = "forest_99999.jpg"


@pytest.fixture
def folder_with_corrupt_file(tmp_path):
    root = make_landcover(tmp_path / "set", image_size=32, per_class={"train": 2}) / "train"
    (root / "forest" / BAD_NAME).write_bytes(b"\xff\xd8\xff not really a jpeg")
    return root


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("decoder", ["pil", "opencv"])
def test_fail_mode_raises_naming_the_file_without_hanging(folder_with_corrupt_file, workers, decoder):
    dataset = loaders.image_folder_dataset(folder_with_corrupt_file, 32, decoder=decoder, bad_images="fail")
    loader = loaders.make_loader(dataset, make_config("smoke", num_workers=workers, batch_size=4), train=False)
    with pytest.raises(BadImageError, match=BAD_NAME):
        for _ in loaders.batches(loader):  # as the engine's loops read it: a failed loader's workers stop with it
            pass


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 1])
def test_skip_mode_skips_the_file_and_logs_it(folder_with_corrupt_file, workers, caplog):
    dataset = loaders.image_folder_dataset(folder_with_corrupt_file, 32, bad_images="skip")
    loader = loaders.make_loader(dataset, make_config("smoke", num_workers=workers, batch_size=4), train=False)
    with caplog.at_level("WARNING"):
        labels = torch.cat([labels for _, labels in loader])
    assert len(labels) == len(dataset)  # the bad file's slot is filled by the next readable image
    if workers == 0:  # a worker's log record stays in the worker process (it prints to stderr there)
        assert any(BAD_NAME in message for message in caplog.messages)
    assert [BAD_NAME in path for path in dataset.skipped] == [True]  # flagged in shared memory, workers too


# --- a bad image in a DataLoader worker is the worker's one line, not torch's wrapped traceback ----------

@pytest.mark.timeout(60)
def test_a_bad_image_in_a_worker_is_one_line_naming_the_file(folder_with_corrupt_file):
    dataset = loaders.image_folder_dataset(folder_with_corrupt_file, 32, bad_images="fail")
    loader = loaders.make_loader(dataset, make_config("smoke", num_workers=1, batch_size=4), train=False)
    for batches in (loaders.timed_batches(loader), loaders.batches(loader)):  # training and validation loops
        with pytest.raises(BadImageError) as error:
            list(batches)
        message = str(error.value)
        assert message.startswith(str(folder_with_corrupt_file / "forest" / BAD_NAME)) and "\n" not in message
        assert "DataLoader worker process" not in message and "Traceback" not in message  # torch: 20+ lines


@pytest.mark.timeout(60)
def test_a_failed_loaders_workers_are_stopped_with_the_error_not_by_a_later_collection(folder_with_corrupt_file):
    """Left to the error's reference cycle, each worker waited 5 s at the next `gc.collect()` and was then killed
    (the collector closes the queue its stop message needs); `batches` stops them as the error leaves."""
    import psutil

    dataset = loaders.image_folder_dataset(folder_with_corrupt_file, 32, bad_images="fail")
    loader = loaders.make_loader(dataset, make_config("smoke", num_workers=2, batch_size=2), train=False)
    before = {child.pid for child in psutil.Process().children()}
    with pytest.raises(BadImageError):
        list(loaders.batches(loader))
    left = [child for child in psutil.Process().children() if child.pid not in before]
    assert [child for child in left if child.is_running() and child.status() != psutil.STATUS_ZOMBIE] == []


@pytest.fixture
def run_folder_with_corrupt_file(tmp_path):
    # 8 classes x 4 + the bad file = 33 = 11 batches of 3: none is dropped, so the bad file is read
    root = make_landcover(tmp_path / "set", image_size=32, per_class={"train": 4, "val": 2})
    (root / "train" / "forest" / BAD_NAME).write_bytes(b"\xff\xd8\xff not really a jpeg")
    return root


def _train_arguments(folder, tmp_path, bad_images, num_workers=1):
    return ["train", "--profile", "smoke", "--no-progress", "-p", "dataset=imagefolder", "-p", f"data_dir={folder}",
            "-p", f"num_workers={num_workers}", "-p", "batch_size=3", "-p", "max_steps=0", "-p", "max_train_images=0",
            "-p", f"bad_images={bad_images}", "-p", f"output_dir={tmp_path / 'out'}"]


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_workbook_train_names_a_workers_bad_image_in_one_line_and_in_the_ledger(run_folder_with_corrupt_file,
                                                                                tmp_path, capsys):
    from course_lib import cli, ledger

    assert cli.main(_train_arguments(run_folder_with_corrupt_file, tmp_path, "fail")) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("workbook train: error: ") and BAD_NAME in lines[0], lines
    row = ledger.Ledger().rows(kind="train")[0]
    assert row["status"] == "failed" and BAD_NAME in row["metrics"]["error"]


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_skipped_images_are_counted_across_workers_printed_and_recorded(run_folder_with_corrupt_file, tmp_path,
                                                                        capsys):
    from course_lib import cli, ledger

    assert cli.main(_train_arguments(run_folder_with_corrupt_file, tmp_path, "skip")) == 0
    assert "skipped 1 unreadable image(s) (bad_images=skip" in capsys.readouterr().out
    assert ledger.Ledger().rows(kind="train")[0]["metrics"]["skipped_images"] == 1


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_data_wait_fraction_from_a_controlled_clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(loaders, "now", lambda device=None: clock.now)  # the one clock data/ reads

    def slow_loader(count, wait):
        for index in range(count):
            clock.now += wait  # seconds the step waits for this batch
            yield index

    timer = loaders.DataWaitTimer()
    for _ in loaders.timed_batches(slow_loader(4, 3.0), timer):
        clock.now += 1.0  # seconds of compute per step
    assert timer.batches == 4
    assert timer.wait_seconds == pytest.approx(12.0) and timer.total_seconds == pytest.approx(16.0)
    assert timer.data_wait_fraction == pytest.approx(0.75)


def test_timed_batches_stops_at_max_batches():
    timer = loaders.DataWaitTimer()
    assert list(loaders.timed_batches(range(10), timer, max_batches=3)) == [0, 1, 2]
    assert timer.batches == 3 and 0.0 <= timer.data_wait_fraction <= 1.0


def test_make_loader_keeps_its_signature_and_knobs():
    config = make_config("smoke", num_workers=2, prefetch_factor=4, persistent_workers=True, pin_memory=True)
    loader = loaders.make_loader(list(range(10)), config, train=True, batch_size=3, drop_last=False)
    assert loader.num_workers == 2 and loader.prefetch_factor == 4 and loader.persistent_workers
    assert loader.pin_memory == torch.cuda.is_available()  # pinning needs CUDA; never faked on
    assert loader.batch_size == 3 and not loader.drop_last


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 8 workers of a pretend 16-core machine
def test_minus_one_workers_resolve_to_the_recommended_number_in_every_loader(monkeypatch):
    from course_lib import devices

    monkeypatch.setattr(devices, "physical_cores", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    dataset = torch.utils.data.TensorDataset(torch.zeros(8, 1))
    config = make_config("smoke", num_workers=-1)
    assert loaders.make_loader(dataset, config, train=False).num_workers == 8  # half of 16 physical cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: four training processes share the cores
    assert loaders.make_loader(dataset, config, train=False).num_workers == 2
    assert loaders.resolved_num_workers(make_config("smoke", num_workers=3)) == 3


def test_a_stream_takes_no_sampler_unless_it_splits_itself_across_ranks():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from range(4)

    config = make_config("smoke", num_workers=0)
    sampler = torch.utils.data.SequentialSampler(range(4))
    with pytest.raises(ConfigError, match="does not split itself across ranks"):
        loaders.make_loader(Stream(), config, train=True, sampler=sampler)
    Stream.splits_by_rank = True
    loader = loaders.make_loader(Stream(), config.replace(batch_size=2), train=True, sampler=sampler)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]


def test_data_wait_timer_speeds():
    from course_lib.data import loaders

    timer = loaders.DataWaitTimer(wait_seconds=1.0, total_seconds=4.0, batches=8)
    speeds = timer.speeds(batch_size=16)
    assert speeds["images_per_second"] == pytest.approx(32.0)
    assert speeds["compute_images_per_second"] == pytest.approx(128 / 3)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("bad_images", ["fail", "skip"])
@pytest.mark.slow
def test_a_damaged_png_with_decoder_torchvision_in_2_workers_is_one_line_or_a_counted_skip(tmp_path, capsys,
                                                                                           bad_images):
    """Issue 30 point 3: libpng's error crashed the worker (SIGSEGV): a 64-line traceback with 2 workers,
    exit 139 with none, no ledger row, and bad_images=skip did not help."""
    from PIL import Image

    from course_lib import cli, ledger

    root = make_landcover(tmp_path / "set", image_size=32, per_class={"train": 4, "val": 2})
    png = root / "train" / "forest" / "forest_99999.png"
    Image.open(next((root / "train" / "forest").glob("*.jpg"))).save(png)
    damaged = bytearray(png.read_bytes())
    damaged[damaged.index(b"IDAT") + 40] ^= 0xFF  # one byte of the compressed pixels
    png.write_bytes(bytes(damaged))
    arguments = [*_train_arguments(root, tmp_path, bad_images, num_workers=2), "-p", "decoder=torchvision"]
    code = cli.main(arguments)
    row = ledger.Ledger().rows(kind="train")[0]
    if bad_images == "fail":
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and "forest_99999.png: cannot decode image with torchvision" in lines[0]
        assert row["status"] == "failed" and "forest_99999.png" in row["metrics"]["error"]
    else:
        assert code == 0 and row["metrics"]["skipped_images"] == 1
