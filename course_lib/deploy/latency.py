"""Inference speed of a deployed model: latency (milliseconds per batch) and throughput
(images per second) at a batch size, timed with `measure.timing` (warm-up thrown away, median of
repeats), in `torch.inference_mode` on random inputs of the model's shape. Batch 1 is what a
request-at-a-time server sees; a large batch is what offline scoring sees.
"""
from __future__ import annotations

import torch

from course_lib.measure.timing import time_repeats


def inference_speed(model, batch_size: int, image_size: int, *, repeats: int = 5, warmup: int = 2,
                    min_images: int = 16, channels_last: bool = False) -> dict:
    """{batch_size, milliseconds (median per batch), images_per_second} of `model(images)` on the CPU.
    Each repeat runs enough batches for at least `min_images` images, so batch 1 is not timed on a
    single sub-millisecond call."""
    images = torch.randn(batch_size, 3, image_size, image_size)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    calls = max(1, -(-min_images // batch_size))
    with torch.inference_mode():
        timing = time_repeats(lambda: model(images), repeats=repeats, warmup=warmup, calls=calls)
    return {"batch_size": batch_size, "milliseconds": timing.median * 1e3,
            "images_per_second": timing.per_second(batch_size)}


def speed_row(model, image_size: int, batch_sizes=(1, 64), **options) -> dict:
    """Latency at each batch size as flat columns: `ms@1`, `images/s@64` ..."""
    row = {}
    for batch_size in batch_sizes:
        speed = inference_speed(model, batch_size, image_size, **options)
        row[f"ms@{batch_size}"] = speed["milliseconds"]
        row[f"images/s@{batch_size}"] = speed["images_per_second"]
    return row
