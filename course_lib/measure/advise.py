"""Which card fits the job (`workbook advise`; article 1, section 1.3: "more memory beats more compute",
and article 2's table of RTX 3090/4090 against A100/H100): for one model, batch, image size and precision,
each card's answer to two questions.

- Does one training step fit its memory? The estimator notebook 01 checks against measured peaks
  (`memory.estimate_training_memory` on the meta device: weights, gradients, optimizer state, activations
  from the shapes, the input batch) against `memory_fit.FIT_MARGIN` of the card's memory, as `workbook train`'s
  start-up check does; with the largest batch that would fit.
- How fast could it train? Training FLOPs per image counted by torch (`flops.training_flops_per_image`)
  against the card's dense datasheet peak for the precision (`peak.DATASHEET_TFLOPS`), at a stated MFU.

Both are estimates from shapes and datasheets, not measurements: a measured MFU (notebook 03, `workbook
gpu-check`) is the figure to give as `mfu`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from course_lib.measure import flops, memory, memory_fit, peak

# (card, its DATASHEET_TFLOPS row, memory in GiB as its datasheet gives it), by memory
CARDS = (
    ("RTX 3090", "RTX 3090", 24),
    ("RTX 4090", "RTX 4090", 24),
    ("A100 40GB", "A100", 40),
    ("L40S", "L40S", 48),
    ("A100 80GB", "A100", 80),
    ("H100 SXM", "H100 SXM", 80),
    ("H200 SXM", "H200 SXM", 141),
)
DEFAULT_MFU = 0.35  # a stated share of the peak, for the speed column; replace it with your measured MFU
PRECISIONS = ("off", "fp16", "bf16")  # off: fp32 (against the plain fp32 peak, as torch's default matmul precision)


@dataclass
class CardAdvice:
    card: str
    memory_gib: float
    fits: bool  # one training step's estimate within FIT_MARGIN of the memory
    estimated_gib: float  # the step's estimated memory
    largest_batch: int  # the largest batch whose estimate fits
    peak_tflops: float  # dense datasheet peak for the precision
    images_per_second: float  # at the stated MFU

    def to_dict(self) -> dict:
        return asdict(self)


def advise(model: str, batch_size: int, image_size: int, precision: str = "bf16", optimizer: str = "sgd",
           num_classes: int = 1000, mfu: float = DEFAULT_MFU) -> list[CardAdvice]:
    """One CardAdvice per card of CARDS, for training `model` (a timm name) at `batch_size` x `image_size`
    px in `precision` ("off" for fp32, "fp16", "bf16") with `optimizer`."""
    import timm

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be a share of the peak, above 0 and at most 1, got {mfu}")
    estimate = memory.estimate_training_memory(model, batch_size, image_size, precision, optimizer, device="meta",
                                               num_classes=num_classes)
    per_image = flops.training_flops_per_image(timm.create_model(model, num_classes=num_classes), image_size)
    dtype = "fp32" if precision == "off" else precision
    found = []
    for card, row, gib in CARDS:
        budget = memory_fit.FIT_MARGIN * gib * 2**30
        tflops = peak.DATASHEET_TFLOPS[row][dtype]
        found.append(CardAdvice(card=card, memory_gib=gib, fits=estimate.total_bytes <= budget,
                                estimated_gib=estimate.total_bytes / 2**30,
                                largest_batch=memory.largest_batch_within(estimate, int(budget)), peak_tflops=tflops,
                                images_per_second=mfu * tflops * 1e12 / per_image))
    return found


def format_advice(found: list[CardAdvice], model: str, batch_size: int, image_size: int, precision: str,
                  mfu: float) -> str:
    """The table `workbook advise` prints, under a line saying what it is and is not."""
    lines = [f"{model}, batch {batch_size} at {image_size} px, {'fp32' if precision == 'off' else precision}: "
             f"one training step needs about {found[0].estimated_gib:.1f} GiB (estimated from shapes); images/s at "
             f"{mfu:.0%} MFU of each card's datasheet peak (an estimate: your measured MFU replaces it)",
             f"{'card':<10} {'memory':>8} {'fits':>5} {'largest batch':>14} {'peak TFLOP/s':>13} {'images/s':>9}"]
    lines += [f"{item.card:<10} {item.memory_gib:>5.0f} GiB {'yes' if item.fits else 'no':>5} {item.largest_batch:>14,}"
              f" {item.peak_tflops:>13,.1f} {item.images_per_second:>9,.0f}" for item in found]
    return "\n".join(lines)
