"""Issue 47, point 1: the `rotation` augmentation (small angles, per image, on the device and in the workers alike)
and notebook 07's augmentation-strength section: its levels, tables and claim."""
import math

import pytest
import torch

from course_lib.chapters import augmentation_strength
from course_lib.config import ConfigError, make_config
from course_lib.data import pipeline, rotation, transforms


def _pattern(count=1, size=32):
    """Images with structure in every direction (a rotation moves it), values in [0.2, 1] (a zero is a filled corner)."""
    y, x = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    image = 0.2 + 0.8 * torch.stack([x, y, (x * 7).sin().abs() * y])
    return image.expand(count, -1, -1, -1).clone()


def test_a_turn_of_zero_degrees_is_the_identity():
    images = _pattern(4)
    assert torch.allclose(rotation.rotate(images, torch.zeros(4)), images, atol=1e-5)
    assert rotation.batch_rotate(images, 0.0) is images


def test_a_turn_matches_torchvision_inside_the_corners_it_fills():
    from torchvision.transforms.v2 import functional

    images = _pattern(1, 64)
    turned = rotation.rotate(images, torch.tensor([10.0]))
    expected = functional.rotate(images, 10.0, interpolation=functional.InterpolationMode.BILINEAR)
    inner = (slice(None), slice(None), slice(16, 48), slice(16, 48))  # away from the filled corners
    assert torch.allclose(turned[inner], expected[inner], atol=0.02)
    assert not torch.allclose(turned[inner], images[inner], atol=0.02)


def test_each_image_gets_its_own_angle_within_the_range_and_no_black_corners():
    images = _pattern(8)
    generator = torch.Generator().manual_seed(0)
    turned = rotation.batch_rotate(images, 15.0, generator)
    assert turned.shape == images.shape
    assert len({round(float(image.sum()), 3) for image in turned}) == 8  # eight different turns
    assert float(turned[:, :, 0, 0].min()) >= 0.19  # corners reflect-filled from the image, not 0
    # the angles are drawn from [-15, 15]: a 15-degree turn moves the image at most so far
    most = (rotation.rotate(images[:1], torch.tensor([15.0])) - images[:1]).abs().mean()
    assert float((turned - images).abs().mean(dim=(1, 2, 3)).max()) <= float(most) + 1e-4


def test_the_worker_transform_turns_with_the_same_arithmetic_as_the_device():
    image = _pattern(1)[0]
    torch.manual_seed(3)
    in_worker = transforms.RandomRotate(20.0)(image)
    torch.manual_seed(3)
    on_device = rotation.batch_rotate(image[None], 20.0)[0]
    assert torch.equal(in_worker, on_device)


def test_the_rotation_field_reaches_both_places_and_refuses_large_angles():
    config = make_config("smoke", rotation=12.0, augment_recipe="heavy")
    recipe = transforms.recipe_for(config)
    assert recipe.rotation == 12.0 and recipe.brightness == transforms.HEAVY.brightness
    assert transforms.recipe_for(make_config("smoke")) is transforms.LIGHT
    cpu_steps = transforms.train_transform(32, recipe).transforms
    assert any(isinstance(step, transforms.RandomRotate) for step in cpu_steps)
    train_tf, _, stage = pipeline.split_transforms(config.replace(augmentation="device"))
    assert stage.train_transform.recipe.rotation == 12.0
    assert "rotation 12 degrees" in pipeline.describe(config)
    for bad in (-1.0, 90.0, math.nan):
        with pytest.raises(ConfigError, match="rotation") as raised:
            make_config("smoke", rotation=bad)
        assert "\n" not in str(raised.value)


def test_the_levels_and_the_studys_sizes():
    config = make_config("smoke", storage="device", augmentation="device", label_smoothing=0.1, mixup_alpha=0.2)
    study = augmentation_strength.study(config, "cpu")
    assert study.levels == ["none", "light", "heavy"] and study.seeds == [0, 1, 2]
    assert study.config.max_train_images == 1000 and study.config.epochs == 12
    assert study.config.storage == "cache"  # augmentation none cannot run on a resident split
    assert study.config.label_smoothing == 0.0 and study.config.mixup_alpha == 0.0  # only the augmentation changes
    heavy = study.config_for("heavy", 2)
    assert (heavy.seed, heavy.augment_recipe, heavy.rotation) == (2, "heavy", augmentation_strength.HEAVY_ROTATION)
    assert study.config_for("none", 0).augmentation == "none"
    assert augmentation_strength.study(config, "smoke", "none,heavy", epochs=3).levels == ["none", "heavy"]
    assert augmentation_strength.study(config, "smoke", epochs=3).config.epochs == 3
    for bad in ("light,heavy", "none", "none,strong"):
        with pytest.raises(ConfigError, match="augmentation_levels"):
            augmentation_strength.select_levels(bad)
    with pytest.raises(ConfigError, match="seeds"):
        augmentation_strength.study(config, "cpu", seeds=1)


def strength_rows(effects: dict, seeds=(0, 1, 2), epochs=4) -> list[dict]:
    """Made-up runs: per level (gap change, validation change) against no augmentation at the last epoch. Without
    augmentation the training top-1 climbs to 99% and validation stays near 80%; a seed moves both a little."""
    rows = []
    for seed in seeds:
        for level, (gap, val) in effects.items():
            for epoch in range(1, epochs + 1):
                progress = epoch / epochs
                val_top1 = 0.60 + 0.20 * progress + 0.004 * seed + val * progress
                train_top1 = 0.70 + 0.29 * progress + 0.003 * seed + (val + gap) * progress
                rows.append({"level": level, "seed": seed, "epoch": epoch, "train top-1": train_top1,
                             "val top-1": val_top1})
    return rows


def test_the_tables_say_how_much_of_the_gap_a_level_removes_and_when_it_pays_off():
    rows = strength_rows({"none": (0.0, 0.0), "light": (-0.05, 0.01), "heavy": (-0.12, 0.02)})
    curves = augmentation_strength.curves(rows)
    assert set(curves["level"]) == {"none", "light", "heavy"} and curves["epoch"].max() == 4
    last = curves[(curves["level"] == "none") & (curves["epoch"] == 4)].iloc[0]
    assert last["gap mean"] == pytest.approx(100 * (0.99 - 0.80 + 0.003 - 0.004), abs=0.01)
    table = augmentation_strength.final_table(rows)
    assert table.loc["heavy", "gap below none"] == pytest.approx(12.0, abs=0.01)
    assert table.loc["light", "gap below none"] == pytest.approx(5.0, abs=0.01)
    assert table.loc["heavy", "pays off from epoch"] == 1


def test_where_a_level_starts_to_pay_off():
    rows = strength_rows({"none": (0.0, 0.0), "heavy": (-0.1, 0.0)}, epochs=4)
    for row in rows:  # heavy starts 3 points behind and ends 1 point ahead
        if row["level"] == "heavy":
            row["val top-1"] += -0.03 + 0.04 * (row["epoch"] - 1) / 3
    table = augmentation_strength.curves(rows)
    assert augmentation_strength.payoff_epoch(table, "heavy") == 4
    behind = [dict(row, **{"val top-1": row["val top-1"] - 0.05}) if row["level"] == "heavy" else row for row in rows]
    assert augmentation_strength.payoff_epoch(augmentation_strength.curves(behind), "heavy") is None


def test_the_claim_holds_only_when_the_gap_shrinks_and_validation_rises():
    from course_lib.analysis import claims

    def verdict(gap, val):
        rows = strength_rows({"none": (0.0, 0.0), "light": (gap / 2, val / 2), "heavy": (gap, val)})
        [claim] = augmentation_strength.claims(rows, hardware="test machine")
        assert claim.key == "augmentation_prevents_overfitting"
        return claim

    helped = verdict(-0.10, 0.03)
    assert helped.verdict == claims.HOLDS and helped.measured == pytest.approx(10.0, abs=0.01)
    assert "with heavy" in helped.reason
    assert verdict(-0.10, -0.03).verdict == claims.REFUTED  # a smaller gap bought with lower accuracy
    assert verdict(0.0, 0.0).verdict == claims.REFUTED  # no change at all: wholly below the half point
    rows = strength_rows({"none": (0.0, 0.0)})
    assert augmentation_strength.claims(rows)[0].verdict == claims.NOT_MEASURABLE
    [one] = augmentation_strength.claims(strength_rows({"none": (0.0, 0.0), "heavy": (-0.10, 0.03)}, seeds=(0,)),
                                         hardware="test machine")
    assert one.verdict == claims.NOT_SHOWN and "one seed" in one.reason and one.measured == pytest.approx(10.0, abs=0.01)


def test_a_new_field_at_its_old_behaviour_keeps_the_digest_of_models_already_trained():
    from course_lib.models import checkpoint

    config = make_config("smoke")
    before = {key: value for key, value in config.to_dict().items() if key != "rotation"}  # a Config of before
    assert checkpoint.config_digest(config.to_dict()) == checkpoint.config_digest(before)
    assert checkpoint.config_digest(config.replace(rotation=10.0).to_dict()) != checkpoint.config_digest(before)
