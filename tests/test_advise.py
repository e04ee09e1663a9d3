"""`workbook advise`: each card's fit is the memory estimator's answer against FIT_MARGIN of its memory, and
its images/s the stated MFU of its datasheet peak over the counted training FLOPs (issue 47, point 4)."""
import json

import pytest
import timm

from course_lib import cli
from course_lib.measure import advise, flops, memory, memory_fit, peak


@pytest.mark.slow
def test_each_card_is_the_estimator_and_the_datasheet():
    found = advise.advise("resnet18", 64, 64, "bf16", "sgd", num_classes=10, mfu=0.5)
    assert [item.card for item in found] == [card for card, _, _ in advise.CARDS]
    estimate = memory.estimate_training_memory("resnet18", 64, 64, "bf16", "sgd", device="meta", num_classes=10)
    per_image = flops.training_flops_per_image(timm.create_model("resnet18", num_classes=10), 64)
    for item, (card, row, gib) in zip(found, advise.CARDS):
        budget = memory_fit.FIT_MARGIN * gib * 2**30
        assert item.estimated_gib == pytest.approx(estimate.total_bytes / 2**30)
        assert item.fits == (estimate.total_bytes <= budget) and item.fits  # a small model fits every card
        assert item.largest_batch == memory.largest_batch_within(estimate, int(budget)) > 64
        assert item.peak_tflops == peak.DATASHEET_TFLOPS[row]["bf16"]
        assert item.images_per_second == pytest.approx(0.5 * item.peak_tflops * 1e12 / per_image)
    assert found[-1].largest_batch > found[0].largest_batch  # 141 GiB holds more than 24 GiB


@pytest.mark.slow
def test_a_step_too_large_for_the_small_cards_fits_only_the_large_ones():
    found = {item.card: item for item in advise.advise("resnet50", 1024, 224, "off", "adamw")}
    assert not found["RTX 3090"].fits and found["RTX 3090"].largest_batch < 1024
    assert [item.fits for item in found.values()] == sorted(item.fits for item in found.values())  # by memory
    assert found["H100 SXM"].peak_tflops == peak.DATASHEET_TFLOPS["H100 SXM"]["fp32"]


@pytest.mark.slow
def test_the_command_prints_the_table_and_refuses_bad_input_in_one_line(capsys):
    assert cli.main(["advise", "--model", "resnet18", "--batch-size", "32", "--image-size", "64", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["card"] for row in rows][-1] == "H200 SXM" and all(row["fits"] for row in rows)
    assert cli.main(["advise", "--model", "resnet18", "--batch-size", "32", "--image-size", "64"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("resnet18, batch 32 at 64 px, bf16: one training step needs about")
    assert text[-1].startswith("H200 SXM") and len(text) == 2 + len(advise.CARDS)
    for argv, message in ((["--precision", "fp8"], "precision must be one of off, fp16, bf16"),
                          (["--mfu", "1.5"], "mfu must be a share of the peak"),
                          (["--batch-size", "0"], "--batch-size must be 1 or more"),
                          (["--model", "no_such_net"], "--model no_such_net: Unknown model")):
        assert cli.main(["advise", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
