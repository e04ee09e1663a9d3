"""The gpu profile rehearsed on the CPU: `workbook run --profile rehearsal` runs each notebook's smoke
branches with the gpu profile's switches on (pinned memory, a persistent worker, channels_last,
augmentation=device, precision=auto, matmul_precision=high, cudnn_benchmark), skipping by name only
what acts on CUDA alone. CI rehearses the notebooks in REHEARSED (the rest cost minutes each at these
settings; see the README's "Running on a short offline GPU slot")."""
import os

import nbformat
import pytest

from course_lib import devices, runner
from course_lib.config import PROFILES, REHEARSAL_ENV, REHEARSAL_SWITCHES, make_config

REHEARSED = ["00_setup_check", "02_data_pipeline", "03_mixed_precision_and_compile"]
TRAINS_WITH_THE_ENGINE = {"03_mixed_precision_and_compile"}  # its train.fit runs print the engine's log


def test_the_rehearsal_is_smoke_sizes_with_the_gpu_profiles_switches():
    config = make_config("rehearsal")
    smoke, gpu = make_config("smoke"), make_config("gpu")
    for name in ("image_size", "batch_size", "max_steps", "max_train_images", "model", "data_dir", "device"):
        assert getattr(config, name) == getattr(smoke, name)
    for name in ("pin_memory", "persistent_workers", "channels_last", "augmentation", "precision",
                 "matmul_precision", "cudnn_benchmark"):
        assert getattr(config, name) == getattr(gpu, name) == REHEARSAL_SWITCHES[name]
    assert config.num_workers == 1 and "rehearsal" in PROFILES


def test_the_rehearsal_kernel_gets_smoke_with_the_switches(monkeypatch):
    monkeypatch.delenv(REHEARSAL_ENV, raising=False)
    with runner.rehearsal_kernel("rehearsal") as profile:
        assert profile == "smoke" and os.environ[REHEARSAL_ENV] == "1"
        inside = make_config("smoke", batch_size=8)
        assert inside.pin_memory and inside.augmentation == "device" and inside.batch_size == 8
        assert make_config("cpu").augmentation == "cpu"  # only the smoke branches are rehearsed
    assert REHEARSAL_ENV not in os.environ and make_config("smoke").augmentation == "cpu"
    with runner.rehearsal_kernel("cpu") as profile:
        assert profile == "cpu" and REHEARSAL_ENV not in os.environ


def test_cuda_only_switches_are_named_with_their_reason():
    config = make_config("rehearsal", compile=True, compile_mode="reduce-overhead", decoder="nvjpeg", storage="cache")
    skipped = devices.skipped_switches(config, "cpu")
    assert [line.split(":")[0] for line in skipped] == ["pin_memory=True", "cudnn_benchmark=True",
                                                        "matmul_precision=high", "compile_mode=reduce-overhead",
                                                        "decoder=nvjpeg"]
    assert all(len(line.split(": ", 1)[1]) > 10 for line in skipped)
    assert devices.skipped_switches(config, "cuda:0") == []
    assert devices.skipped_switches(make_config("smoke"), "cpu") == []
    assert "skipped, CUDA only: pin_memory=True" in runner.rehearsal_line()


def test_the_engine_logs_what_it_skips(capsys):
    from course_lib.engine import train

    train.prepare(make_config("rehearsal", precision="off", num_workers=0, persistent_workers=False))
    out = capsys.readouterr().out
    assert "no effect on cpu: pin_memory=True: pinned memory only speeds copies to a CUDA GPU" in out
    assert "no effect on cpu: matmul_precision=high" in out


@pytest.mark.notebook
@pytest.mark.parametrize("stem", REHEARSED)
def test_notebook_rehearses_the_gpu_profile(stem, tmp_path, notebooks_home):
    (path,) = notebooks_home.glob(f"{stem}.ipynb")
    result = runner.execute_notebook(path, tmp_path / path.name, {"profile": "rehearsal"})
    assert result.status == "ok", f"{path.name} failed in the rehearsal: {result.error}"
    executed = nbformat.read(str(tmp_path / path.name), as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and 'profile = "smoke"' in injected[0].source
    if stem in TRAINS_WITH_THE_ENGINE:  # the switches reached the engine, and what it skipped is named
        printed = "".join(output.get("text", "") for cell in executed.cells for output in cell.get("outputs", []))
        assert "no effect on cpu: pin_memory=True: pinned memory only speeds copies to a CUDA GPU" in printed
