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
ALL_DECODERS = CPU_DECODERS + [pytest.param("nvjpeg", marks=pytest.mark.cuda(reason="nvJPEG needs a CUDA GPU"))]


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


# --- issue 30 point 3: a damaged PNG is a BadImageError under decoder=torchvision, not a crash -----------

DAMAGE_SCRIPT = r"""
import io, struct, sys, zlib
import numpy as np
from PIL import Image
from course_lib.data import decode
from course_lib.data.images import BadImageError

def png(pixels, **options):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG", **options)
    return buffer.getvalue()

def with_crcs_fixed(data):  # so the damage reaches the checks behind the CRC
    data, position = bytearray(data), 8
    while position + 12 <= len(data):
        length = struct.unpack(">I", data[position:position + 4])[0]
        end = position + 12 + length
        if end > len(data):
            break
        data[end - 4:end] = struct.pack(">I", zlib.crc32(data[position + 4:end - 4]))
        position = end
    return bytes(data)

rng = np.random.default_rng(0)
palette = io.BytesIO()
Image.fromarray(rng.integers(0, 255, (9, 9, 3), dtype=np.uint8)).convert("P").save(palette, "PNG")
images = {"rgb": png(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)),
          "interlaced-grey": png(rng.integers(0, 255, (13, 11), dtype=np.uint8), interlace=1),
          "palette": palette.getvalue(), "16-bit": png(rng.integers(0, 65535, (7, 5), dtype=np.uint16))}
decoder = decode.get_decoder("torchvision")
outcomes = {"decoded": 0, "refused": 0}
for name, good in images.items():
    decode.check_png(good)  # a sound PNG passes the check
    decoder.decode(good, name)
    for position in range(8, len(good)):
        for fixed in (False, True):
            damaged = bytearray(good)
            damaged[position] ^= 0x5A
            damaged = with_crcs_fixed(damaged) if fixed else bytes(damaged)
            print(name, position, fixed, file=sys.stderr, flush=True)  # the last line names a crash's input
            try:
                decoder.decode(damaged, f"{name}@{position}")
                outcomes["decoded"] += 1
            except BadImageError as error:
                assert f"{name}@{position}: cannot decode image with torchvision" in str(error), error
                outcomes["refused"] += 1
    for cut in range(8, len(good), 3):
        try:
            decoder.decode(good[:cut], f"{name} cut at {cut}")
        except BadImageError:
            outcomes["refused"] += 1
print(outcomes)
"""


@pytest.mark.slow
def test_damaged_pngs_never_crash_the_torchvision_decoder(tmp_path):
    """torchvision's PNG decoder took the process down (SIGSEGV, exit 139) on any libpng error, such as
    one flipped IDAT byte, so bad_images=skip could not help. Every byte of four kinds of PNG is damaged
    in turn (with and without the chunk CRCs recomputed), in a child process that a crash would end."""
    import ast
    import os
    import subprocess
    import sys

    from conftest import ROOT

    script = tmp_path / "damage.py"
    script.write_text(DAMAGE_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    last = done.stderr.strip().splitlines()[-1:]
    assert done.returncode == 0, f"exit {done.returncode} after {last}: {done.stderr[-600:]}"
    outcomes = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert outcomes["refused"] > 1000 and outcomes["decoded"] > 0  # damage in pixel bytes still decodes


def test_a_damaged_png_under_skip_is_a_counted_skip(tmp_path):
    from course_lib.data.datasets import ImageFolderDataset

    (tmp_path / "cls").mkdir()
    for index in range(2):
        Image.fromarray(np.full((8, 8, 3), index * 50, np.uint8)).save(tmp_path / "cls" / f"{index}.png")
    damaged = bytearray((tmp_path / "cls" / "0.png").read_bytes())
    damaged[damaged.index(b"IDAT") + 6] ^= 0xFF
    (tmp_path / "cls" / "0.png").write_bytes(bytes(damaged))
    with pytest.raises(BadImageError, match=r"0\.png: cannot decode image with torchvision \(damaged PNG"):
        ImageFolderDataset(tmp_path, bad_images="fail", loader=decode.FileDecoder("torchvision"))[0]
    skipping = ImageFolderDataset(tmp_path, bad_images="skip", loader=decode.FileDecoder("torchvision"))
    assert skipping[0][0].shape == (3, 8, 8) and skipping.skipped == {str(tmp_path / "cls" / "0.png")}


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
