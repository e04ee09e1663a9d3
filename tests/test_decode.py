import io

import numpy as np
import pytest
import torch
from PIL import Image

from course_lib.config import ConfigError
from course_lib.data import decode
from course_lib.data.images import BadImageError
from course_lib.data.landcover import landcover_image

CPU_DECODERS = ["pil", "opencv", "torchvision"]
ALL_DECODERS = CPU_DECODERS + [pytest.param("nvjpeg", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="nvJPEG needs a CUDA GPU"))]


def encode(pixels: np.ndarray, fmt="JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def jpegs():
    return {size: encode(landcover_image("road", 0, size), quality=90) for size in (64, 256)}


@pytest.mark.parametrize("name", ALL_DECODERS)
@pytest.mark.parametrize("size", [64, 256])
def test_every_decoder_gives_pils_pixels_within_jpeg_tolerance(jpegs, name, size):
    reference = decode.get_decoder("pil").decode(jpegs[size]).int()
    pixels = decode.get_decoder(name).decode(jpegs[size]).cpu()
    assert pixels.dtype == torch.uint8 and pixels.shape == (3, size, size)
    difference = (pixels.int() - reference).abs()
    # Different IDCT / chroma upsampling may shift a few levels; a channel swap (BGR) would not pass.
    assert difference.float().mean() < 1.0
    assert difference.max() <= 16


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_png_is_exact_and_rgb_order_is_right(name):
    pixels = np.zeros((8, 8, 3), np.uint8)
    pixels[..., 0] = 200  # pure red: catches BGR output
    decoded = decode.get_decoder(name).decode(encode(pixels, "PNG"))
    assert torch.equal(decoded, torch.from_numpy(pixels).permute(2, 0, 1))


@pytest.mark.parametrize("name", ALL_DECODERS)
def test_corrupt_bytes_raise_bad_image_error_naming_the_source(name):
    with pytest.raises(BadImageError, match="broken.jpg"):
        decode.get_decoder(name).decode(b"\xff\xd8\xff this is not a jpeg", "folder/broken.jpg")


def test_file_decoder_names_the_file_and_survives_pickling(tmp_path):
    import pickle

    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"garbage")
    loader = pickle.loads(pickle.dumps(decode.FileDecoder("opencv")))
    with pytest.raises(BadImageError, match=str(bad)):
        loader(bad)
    with pytest.raises(BadImageError, match="missing.jpg"):
        loader(tmp_path / "missing.jpg")


def test_unknown_decoder_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="pil, opencv, torchvision"):
        decode.get_decoder("libjpeg")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_nvjpeg_without_cuda_is_a_clear_error():
    assert "nvjpeg" not in decode.available_decoders()
    with pytest.raises(ConfigError, match="CUDA"):
        decode.get_decoder("nvjpeg")


def test_benchmark_reports_every_decoder_on_the_same_inputs(jpegs):
    rows = decode.benchmark_decoders([jpegs[64]] * 4, CPU_DECODERS, repeats=1, warmup=0, label="x")
    assert [r["decoder"] for r in rows] == CPU_DECODERS
    for row in rows:
        assert row["images"] == 4 and row["image_size"] == 64
        assert row["images_per_second"] > 0
        assert row["megabytes_per_second"] == pytest.approx(row["megabytes"] / row["seconds_median"])
        assert row["images_per_second_repeats"] == [pytest.approx(row["images_per_second"])]  # one per repeat
    assert rows[0]["speedup_vs_pil"] == 1.0


def test_image_files_spreads_over_classes(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for index in range(5):
            (tmp_path / name / f"{index}.jpg").write_bytes(b"x")
    files = decode.image_files(tmp_path, 4)
    assert len(files) == 4 and {f.parent.name for f in files} == {"a", "b"}


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_a_16_bit_png_is_scaled_to_8_bits_by_every_decoder(tmp_path, name):
    """PIL's convert("RGB") clips 16-bit grey to white; torchvision returns uint16: all give uint8 here."""
    path = tmp_path / "depth.png"
    gradient = np.linspace(0, 65535, 32 * 32).astype(np.uint16).reshape(32, 32)
    Image.fromarray(gradient).save(path)
    pixels = decode.FileDecoder(name)(path)
    assert pixels.dtype == torch.uint8 and pixels.shape == (3, 32, 32)
    # OpenCV keeps the high byte (v // 256), PIL and torchvision round v / 257: at most 1 apart
    assert np.abs(pixels[0].numpy().astype(int) - np.round(gradient / 257)).max() <= 1


@pytest.mark.parametrize("name", ["pil", "opencv", "torchvision"])
def test_a_decode_error_names_the_file_not_a_buffer(name):
    with pytest.raises(BadImageError) as refused:
        decode.get_decoder(name).decode(b"not an image at all", "train/forest/7.jpg")
    message = str(refused.value)
    assert message.startswith("train/forest/7.jpg: cannot decode image") and "BytesIO" not in message, message


def test_a_skip_warning_does_not_advise_turning_skip_on(tmp_path, caplog):
    from course_lib.data import datasets

    folder = tmp_path / "x"
    folder.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "good.png")
    (folder / "bad.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "y").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "y" / "good.png")
    skipping = datasets.ImageFolderDataset(tmp_path, None, "skip", loader=decode.FileDecoder("pil"))
    with caplog.at_level("WARNING"):
        skipping[[p for p, _ in skipping.samples].index(str(folder / "bad.jpg"))]
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(skipped) == 1 and "bad.jpg" in skipped[0] and "bad_images=skip" not in skipped[0], skipped
