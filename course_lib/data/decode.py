"""JPEG decoders behind one interface, and a benchmark that times them on the same bytes.

Every decoder turns encoded bytes into an RGB uint8 tensor (channels x height x width): Pillow
(`PIL.Image.open`), OpenCV (`cv2.imdecode`), torchvision on the CPU (`torchvision.io.decode_jpeg`,
libjpeg-turbo) and, when CUDA is present, torchvision on the GPU (nvJPEG). The article claims
OpenCV's imdecode is about 2x faster than PIL's default JPEG decoding; `benchmark_decoders` measures it.
Docs: https://pytorch.org/vision/stable/io.html, https://docs.opencv.org/4.x/d4/da8/group__imgcodecs.html
"""
from __future__ import annotations

import io
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from course_lib.config import DECODER_NAMES
from course_lib.data.images import (
    IMAGE_EXTENSIONS,
    SKIP_HINT,
    BadImageError,
    decode_reason,
    to_rgb,
)

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


def _decode_torchvision(data: bytes) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image

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
    from course_lib.config import ConfigError

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
    """Item i of an ImageFolderDataset's `indices` as (index, transform(decoded image), label, "")
    or, for an unreadable file under bad_images=skip, (index, None, label, path); under fail the
    BadImageError (with the path) propagates. Decoded images come back on the CPU. The one
    decode-everything-once pass behind the cache and the shard check (`decode_once`)."""

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
    """Yield (index, image or None, label, bad path or "") for `indices` of `dataset` (an
    ImageFolderDataset whose loader is a FileDecoder), in order, decoded by `num_workers` DataLoader
    workers; -1 = the recommended number. nvjpeg decodes in this process (CUDA does not work in
    forked workers)."""
    from torch.utils.data import DataLoader

    from course_lib.devices import resolve_num_workers

    workers = resolve_num_workers(num_workers)
    if getattr(dataset.loader, "name", "") == "nvjpeg":
        workers = 0
    loader = DataLoader(DecodeOrReport(dataset, indices, keep_pixels), batch_size=batch_size,
                        num_workers=workers, collate_fn=list)
    for batch in loader:
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


def time_decoder(decoder: Decoder, blobs: list[bytes], repeats: int = 5, warmup: int = 1,
                 batch: int = 64) -> list[float]:
    """Seconds to decode all `blobs`, once per repeat, after `warmup` thrown-away passes."""
    cuda = decoder.device == "cuda"
    times = []
    for repeat in range(warmup + repeats):
        if cuda:
            torch.cuda.synchronize()  # start the clock with the GPU idle
        start = time.perf_counter()
        for first in range(0, len(blobs), batch):
            decoder.decode_batch(blobs[first:first + batch])
        if cuda:
            torch.cuda.synchronize()  # note: nvJPEG is asynchronous; wait before reading the clock
        if repeat >= warmup:
            times.append(time.perf_counter() - start)
    return times


def benchmark_decoders(blobs: list[bytes], decoders: list[str] | None = None, repeats: int = 5,
                       warmup: int = 1, label: str = "") -> list[dict]:
    """Images/s and MB/s (compressed input) per decoder on the same in-memory bytes, median of
    `repeats`. Reading files is excluded: this is the CPU (or GPU) cost of decoding alone."""
    if not blobs:
        raise ValueError("benchmark_decoders needs at least one encoded image")
    megabytes = sum(len(b) for b in blobs) / 1e6
    height, width = get_decoder("pil").decode(blobs[0]).shape[1:]
    rows = []
    for name in decoders or available_decoders():
        decoder = get_decoder(name)
        times = time_decoder(decoder, blobs, repeats, warmup)
        median = statistics.median(times)
        rows.append({
            "inputs": label, "decoder": name, "device": decoder.device, "image_size": int(max(height, width)),
            "images": len(blobs), "megabytes": megabytes, "repeats": repeats,
            "seconds_median": median, "images_per_second": len(blobs) / median,
            "megabytes_per_second": megabytes / median,
            "images_per_second_repeats": [len(blobs) / seconds for seconds in times],  # for intervals
        })
    fastest_pil = next((r["images_per_second"] for r in rows if r["decoder"] == "pil"), None)
    for row in rows:
        row["speedup_vs_pil"] = row["images_per_second"] / fastest_pil if fastest_pil else None
    return rows
