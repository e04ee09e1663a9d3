"""JPEG decoders behind one interface (timed on the same bytes by `measure.bench.benchmark_decoders`).

Every decoder turns encoded bytes into an RGB uint8 tensor (channels x height x width): Pillow
(`PIL.Image.open`), OpenCV (`cv2.imdecode`), torchvision on the CPU (`torchvision.io.decode_jpeg`,
libjpeg-turbo) and, when CUDA is present, torchvision on the GPU (nvJPEG). The article claims
OpenCV's imdecode is about 2x faster than PIL's default JPEG decoding; `measure.bench` measures it.
Docs: https://pytorch.org/vision/stable/io.html, https://docs.opencv.org/4.x/d4/da8/group__imgcodecs.html
"""
from __future__ import annotations

import io
import os
import struct
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from course_lib.config import DECODER_NAMES, ConfigError
from course_lib.data.images import IMAGE_EXTENSIONS, SKIP_HINT, BadImageError, decode_reason, to_rgb

# torchvision 0.29 warns on every decode call that its image I/O moves to TorchCodec; it still
# works and is what this module measures, so the per-call warning is silenced (this message only).
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)


def _decode_pil(data: bytes) -> torch.Tensor:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        # np.array (not asarray) gives a writable array torch can own without a warning.
        pixels = np.array(to_rgb(image))  # 16-bit grey scaled to 8 bits, not clipped
    return torch.from_numpy(pixels).permute(2, 0, 1)


_opencv_single_threaded_in: int | None = None  # the process id that set OpenCV to one thread


def _decode_opencv(data: bytes) -> torch.Tensor:
    import cv2

    global _opencv_single_threaded_in
    if _opencv_single_threaded_in != os.getpid():
        # One decode is one small image: OpenCV's own thread pool only adds hand-offs, and in N
        # DataLoader workers it oversubscribes the cores. Measured on EuroSAT in one worker on 2 cores
        # (AMD EPYC): 194 images/s with OpenCV's default pool, 1,545 with one thread.
        cv2.setNumThreads(1)
        _opencv_single_threaded_in = os.getpid()
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if pixels is None:  # OpenCV signals failure with None, not an exception
        raise ValueError("cv2.imdecode returned None")
    # OpenCV decodes to BGR; the conversion is part of the honest cost.
    return torch.from_numpy(cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)).permute(2, 0, 1)


def _as_byte_tensor(data: bytes) -> torch.Tensor:
    # bytearray: torch.frombuffer wants a writable buffer (the copy is a few KB).
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel (PNG spec, 11.2.2)
_PNG_BIT_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def check_png(data: bytes) -> None:
    """Raise ValueError naming what is wrong with a PNG, checking all libpng calls png_error on while reading (chunk
    framing and CRCs, the header, PLTE, unknown critical chunks, the IDAT stream, its length, each row's filter byte).
    torchvision's PNG decoder (0.29) crashes the process (SIGSEGV) on any png_error instead of raising, so
    decoder=torchvision runs this first: one extra inflate (zlib, in C) per PNG. https://www.w3.org/TR/png-3/"""
    position, header, palette, compressed = len(PNG_SIGNATURE), None, False, []
    while True:
        if position + 8 > len(data):
            raise ValueError("truncated PNG: it ends before its IEND chunk")
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        end = position + 12 + length
        if end > len(data):
            raise ValueError(f"truncated PNG: its {kind.decode('latin-1')!r} chunk is cut short")
        if zlib.crc32(data[position + 4:end - 4]) != struct.unpack(">I", data[end - 4:end])[0]:
            raise ValueError(f"damaged PNG: the CRC of its {kind.decode('latin-1')!r} chunk does not match")
        body = data[position + 8:end - 4]
        if header is None and kind != b"IHDR":
            raise ValueError("damaged PNG: its first chunk is not IHDR")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body) if length == 13 else None
            if header is None:
                raise ValueError("damaged PNG: its IHDR chunk is not 13 bytes")
        elif kind == b"PLTE":
            palette = True
        elif kind == b"IDAT":
            compressed.append(body)
        elif kind == b"IEND":
            break
        elif kind[0] & 0x20 == 0:  # an upper-case first letter marks a chunk a reader must understand
            raise ValueError(f"damaged PNG: unknown critical chunk {kind.decode('latin-1')!r}")
        position = end
    width, height, bit_depth, colour, method, filtering, interlace = header
    if not (0 < width < 2**31 and 0 < height < 2**31) or colour not in _PNG_CHANNELS \
            or bit_depth not in _PNG_BIT_DEPTHS[colour] or method or filtering or interlace not in (0, 1):
        raise ValueError(f"damaged PNG: impossible header ({width}x{height}, bit depth {bit_depth}, "
                         f"colour type {colour}, interlace {interlace})")
    if colour == 3 and not palette:
        raise ValueError("damaged PNG: a palette image without a PLTE chunk")
    if not compressed:
        raise ValueError("damaged PNG: no IDAT chunk")
    try:
        rows = zlib.decompress(b"".join(compressed))
    except zlib.error as error:
        raise ValueError(f"damaged PNG: its image data does not inflate ({error})") from None
    bits_per_pixel = _PNG_CHANNELS[colour] * bit_depth
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    offset = 0
    for x0, y0, dx, dy in passes:
        pass_width, pass_height = max(0, -(-(width - x0) // dx)), max(0, -(-(height - y0) // dy))
        if not pass_width or not pass_height:
            continue
        row_bytes = 1 + (pass_width * bits_per_pixel + 7) // 8  # a filter byte, then the pixels
        if offset + pass_height * row_bytes > len(rows):
            raise ValueError("damaged PNG: not enough image data")
        if max(rows[offset:offset + pass_height * row_bytes:row_bytes]) > 4:
            raise ValueError("damaged PNG: a row has a filter type other than 0-4")
        offset += pass_height * row_bytes


def _decode_torchvision(data: bytes) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image

    if data[:len(PNG_SIGNATURE)] == PNG_SIGNATURE:
        check_png(data)  # a damaged PNG would crash the process in libpng, not raise
    # decode_image dispatches to libjpeg-turbo for JPEG and handles PNG too.
    pixels = decode_image(_as_byte_tensor(data), mode=ImageReadMode.RGB)
    if pixels.dtype == torch.uint16:  # a 16-bit PNG stays 16-bit: scale to 8 like the other decoders
        pixels = ((pixels.to(torch.int32) * 255 + 32767) // 65535).to(torch.uint8)
    return pixels


def _decode_nvjpeg(data: bytes) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(_as_byte_tensor(data), mode=ImageReadMode.RGB, device="cuda")


@dataclass(frozen=True)
class Decoder:
    """A named decoder: `decode(bytes)` -> uint8 tensor C x H x W on `device`."""

    name: str
    device: str  # where the decoded tensor lives: cpu | cuda
    function: Callable[[bytes], torch.Tensor]

    def decode(self, data: bytes, source: str = "<bytes>") -> torch.Tensor:
        """Decode, turning any failure into a BadImageError that names `source`."""
        try:
            return self.function(data)
        except BadImageError:
            raise
        except Exception as error:  # every library raises its own type for a corrupt file
            raise BadImageError(f"{source}: cannot decode image with {self.name} ({decode_reason(error, source)}); "
                                f"remove or replace it{SKIP_HINT}") from None

    def decode_batch(self, blobs: list[bytes]) -> list[torch.Tensor]:
        """Decode many images; nvJPEG decodes a list in one call, which is where it is fast."""
        if self.name == "nvjpeg":
            from torchvision.io import ImageReadMode, decode_jpeg

            return decode_jpeg([_as_byte_tensor(b) for b in blobs], mode=ImageReadMode.RGB, device="cuda")
        return [self.function(b) for b in blobs]


_FUNCTIONS = {"pil": _decode_pil, "opencv": _decode_opencv, "torchvision": _decode_torchvision,
              "nvjpeg": _decode_nvjpeg}


def get_decoder(name: str) -> Decoder:
    """The decoder called `name`; nvjpeg only when CUDA is available (one-line error otherwise)."""
    if name not in _FUNCTIONS:
        raise ConfigError(f"unknown decoder {name!r}; valid decoders: {', '.join(DECODER_NAMES)}")
    if name == "nvjpeg" and not torch.cuda.is_available():
        raise ConfigError("decoder nvjpeg needs a CUDA GPU; use pil, opencv or torchvision on this machine")
    return Decoder(name, "cuda" if name == "nvjpeg" else "cpu", _FUNCTIONS[name])


def available_decoders() -> list[str]:
    """Decoder names usable here: the three CPU ones, plus nvjpeg when CUDA is present."""
    return [n for n in DECODER_NAMES if n != "nvjpeg" or torch.cuda.is_available()]


class FileDecoder:
    """A picklable path -> tensor loader for `data.ImageFolderDataset(loader=...)`, so DataLoader
    workers decode with the chosen library and a corrupt file raises BadImageError with its path."""

    def __init__(self, name: str = "pil"):
        self.name = name
        self._decoder = get_decoder(name)

    def __call__(self, path: str | os.PathLike) -> torch.Tensor:
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            raise BadImageError(f"{path}: cannot read file ({error}); check permissions{SKIP_HINT}") from None
        return self._decoder.decode(data, str(path))

    def __getstate__(self):
        return {"name": self.name}

    def __setstate__(self, state):
        self.__init__(state["name"])


class DecodeOrReport(torch.utils.data.Dataset):
    """Item i of an ImageFolderDataset's `indices` as (index, transform(image) on the CPU, label, "") or, unreadable
    under bad_images=skip, (index, None, label, path): the one decode-everything-once pass (`decode_once`)."""

    def __init__(self, dataset, indices, keep_pixels: bool = True):
        self.dataset, self.indices, self.keep_pixels = dataset, list(indices), keep_pixels

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, position):
        index = self.indices[position]
        path, target = self.dataset.samples[index]
        try:
            image = self.dataset.loader(path)
        except BadImageError:
            if self.dataset.bad_images == "fail":
                raise
            return index, None, target, str(path)
        if not self.keep_pixels:  # a readability check: nothing to send back to the main process
            return index, torch.empty(0, dtype=torch.uint8), target, ""
        image = self.dataset.transform(image) if self.dataset.transform else image
        return index, image.cpu(), target, ""


def decode_once(dataset, indices, num_workers: int = 0, keep_pixels: bool = True, batch_size: int = 256):
    """Yield (index, image or None, label, bad path or "") for `indices` of the ImageFolderDataset `dataset`, in order,
    decoded by `num_workers` workers (-1: the recommended number); nvjpeg here (CUDA fails in forked workers)."""
    from torch.utils.data import DataLoader

    from course_lib.devices import resolve_num_workers, worker_batches

    workers = resolve_num_workers(num_workers)
    if getattr(dataset.loader, "name", "") == "nvjpeg":
        workers = 0
    loader = DataLoader(DecodeOrReport(dataset, indices, keep_pixels), batch_size=batch_size,
                        num_workers=workers, collate_fn=list)
    for batch in worker_batches(loader):  # a bad file's error stops the workers with it
        yield from batch


def image_files(folder: str | os.PathLike, count: int | None = None) -> list[Path]:
    """Up to `count` image files under `folder`, spread evenly over the sorted list (so every
    class is represented), in a deterministic order."""
    files = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise FileNotFoundError(f"no images under {folder}; give a folder of JPEG files")
    if count and count < len(files):
        stride = len(files) / count
        files = [files[int(i * stride)] for i in range(count)]
    return files


def jpeg_samples(image_size: int, count: int, seed: int = 0, quality: int = 90) -> list[bytes]:
    """`count` landcover-synth JPEGs of `image_size` pixels, encoded in memory (no disk)."""
    from PIL import Image

    from course_lib.data.landcover import LANDCOVER_CLASSES, landcover_image

    blobs = []
    for index in range(count):
        name = LANDCOVER_CLASSES[index % len(LANDCOVER_CLASSES)]
        buffer = io.BytesIO()
        Image.fromarray(landcover_image(name, index, image_size, seed)).save(buffer, "JPEG", quality=quality)
        blobs.append(buffer.getvalue())
    return blobs
