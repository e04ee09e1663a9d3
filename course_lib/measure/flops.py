"""Model FLOPs utilization (MFU): the FLOPs a training step needs, counted by
`torch.utils.flop_counter.FlopCounterMode`, times steps per second, over the peak that
`course_lib.measure.peak.mfu_peak` decides for the step's precision on the device
(Chowdhery et al. 2022, "PaLM", arXiv:2204.02311, App. B).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F


def training_flops_per_image(model: torch.nn.Module, image_size: int, num_classes: int | None = None,
                             batch_size: int = 2) -> float:
    """FLOPs of forward + backward for one image (counted on a copy, on CPU, at batch 2).
    Counts matmuls and convolutions only, as MFU does; elementwise work is not counted."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = copy.deepcopy(model).float().cpu().train()
    images = torch.randn(batch_size, 3, image_size, image_size)
    mapping = {torch.ops.aten.convolution_backward: _grouped_conv_backward_flop}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        logits = probe(images)
        targets = torch.zeros(batch_size, dtype=torch.long)
        F.cross_entropy(logits, targets).backward()
    return counter.get_total_flops() / batch_size


def _grouped_conv_backward_flop(grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed,
                                output_padding, groups, output_mask, out_shape, **kwargs) -> int:
    """torch's count of a convolution's backward, with the weight gradient divided by `groups`: torch
    (2.x) counts it as a dense convolution, which overcounts a depthwise convolution (MobileNet,
    EfficientNet, ConvNeXt) by its channel count and gave MFUs above 100%."""
    from torch.utils.flop_counter import conv_backward_flop

    count = getattr(conv_backward_flop, "__wrapped__", conv_backward_flop)  # the formula on shapes, unwrapped
    arguments = (grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed, output_padding, groups)
    grad_input = count(*arguments, [True, False, False], out_shape=out_shape) if output_mask[0] else 0
    grad_weight = count(*arguments, [False, True, False], out_shape=out_shape) if output_mask[1] else 0
    return grad_input + grad_weight // groups


def model_flops_utilization(flops_per_image: float, images_per_second: float, device, precision="off",
                            matmul_precision: str | None = None) -> dict:
    """{"achieved_flops", "peak_flops", "peak_dtype", "peak_source", "mfu"} for a step trained in `precision`,
    against the one MFU rule's peak (`peak.mfu_peak`: a dense datasheet number, else the measured matmul)."""
    from course_lib.measure import peak

    achieved = flops_per_image * images_per_second
    denominator = peak.mfu_peak(precision, device, matmul_precision)
    peak_value = denominator["peak_flops"]
    return {"achieved_flops": achieved, "peak_flops": peak_value, "peak_dtype": denominator["dtype"],
            "peak_source": denominator["source"], "mfu": achieved / peak_value if peak_value else None}


def with_mfu(table, model: torch.nn.Module, image_size: int, device, precision: str = "off",
             images_per_second: str = "images/s", flops_per_image: float | None = None,
             matmul_precision: str | None = None):
    """`table` with an "MFU" column after its images/s (`model_flops_utilization` per row; None without a speed).
    `precision` and `matmul_precision` are a column of the table or one value for all rows; the run's
    matmul_precision decides fp32's TF32 question rather than this process's settings."""
    flops_per_image = flops_per_image or training_flops_per_image(model, image_size)
    table = table.copy()
    precisions = table[precision] if precision in table.columns else [precision] * len(table)
    # matmul_precision: one value for all rows, or (a table that compares them) its own column
    fp32_math = table[matmul_precision] if matmul_precision in table.columns else [matmul_precision] * len(table)
    values = []
    for speed, name, math_mode in zip(table[images_per_second], precisions, fp32_math):
        ok = speed is not None and math.isfinite(speed) and speed > 0
        values.append(model_flops_utilization(flops_per_image, speed, device, name or "off", math_mode)["mfu"]
                      if ok else None)
    table.insert(list(table.columns).index(images_per_second) + 1, "MFU", values)
    return table
