"""Inference speed of a deployed model: latency (milliseconds per batch) and throughput
(images per second) at a batch size, timed with `instruments.timing` (warm-up thrown away, median of
repeats), in `torch.inference_mode` on random inputs of the model's shape. Batch 1 is what a
request-at-a-time server sees; a large batch is what offline scoring sees. Next to each
images/s, the model FLOPs utilization of inference: forward FLOPs per image (counted by
`torch.utils.flop_counter`) times images/s over the device's matmul peak (`measure.flops`).
"""
from __future__ import annotations

import copy

import torch

from course_lib.instruments.timing import time_repeats


def inference_speed(model, batch_size: int, image_size: int, *, repeats: int = 5, warmup: int = 2,
                    min_images: int = 16, channels_last: bool = False) -> dict:
    """{batch_size, milliseconds (median per batch), images_per_second} of `model(images)` on the CPU. Each repeat runs
    enough batches for at least `min_images` images, so batch 1 is not timed on a single sub-millisecond call."""
    images = torch.randn(batch_size, 3, image_size, image_size)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    calls = max(1, -(-min_images // batch_size))
    with torch.inference_mode():
        timing = time_repeats(lambda: model(images), repeats=repeats, warmup=warmup, calls=calls)
    return {"batch_size": batch_size, "milliseconds": timing.median * 1e3,
            "images_per_second": timing.per_second(batch_size)}


def forward_flops_per_image(model: torch.nn.Module, image_size: int, batch_size: int = 2) -> float:
    """FLOPs of one forward pass per image (matmuls and convolutions, as MFU counts them), on a
    copy in eval mode on the CPU. Count it on the fp32 module: a quantized graph or an onnxruntime
    session does the same arithmetic but hides it from the counter."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = copy.deepcopy(model).float().cpu().eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        probe(torch.randn(batch_size, 3, image_size, image_size))
    return counter.get_total_flops() / batch_size


def speed_row(model, image_size: int, batch_sizes=(1, 64), *, flops_per_image: float | None = None,
              precision: str = "fp32", **options) -> dict:
    """Latency at each batch size as flat columns: `ms@1`, `images/s@1`, `MFU@1`, `ms@64` ...
    MFU (with `flops_per_image`, forward FLOPs: `forward_flops_per_image`) is against the CPU's
    measured matmul peak in `precision` (fp32 or bf16; int8 rows are read against fp32's)."""
    from course_lib.measure import flops

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    row = {}
    for batch_size in batch_sizes:
        speed = inference_speed(model, batch_size, image_size, **options)
        row[f"ms@{batch_size}"] = speed["milliseconds"]
        row[f"images/s@{batch_size}"] = speed["images_per_second"]
        if flops_per_image:
            row[f"MFU@{batch_size}"] = flops.model_flops_utilization(flops_per_image, speed["images_per_second"],
                                                                     "cpu", dtype)["mfu"]
    return row
