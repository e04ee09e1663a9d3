"""`engine.freeze`: frozen epochs change only the head (BatchNorm statistics included), unfreezing
trains everything, the backbone learning-rate scale. Tiny timm models on CPU."""
import pytest
import timm
import torch
from conftest import (
    TARGET_CLASSES,
    TensorImages,
    assert_equal_states,
    save_source_checkpoint,
    split_state,
    tiny_config,
)

from course_lib.config import ConfigError, make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import freeze, train
from course_lib.models import factory


def target_bundle(count=48):
    return DataBundle(TensorImages(count, len(TARGET_CLASSES)), TensorImages(12, len(TARGET_CLASSES), seed=1), None,
                      TARGET_CLASSES, "tensors")


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_frozen_epochs_change_the_head_and_leave_the_backbone_and_its_statistics_alone(tmp_path, optimizer):
    path, _ = save_source_checkpoint(tmp_path)
    config = tiny_config(tmp_path, checkpoint=str(path), freeze_backbone_epochs=1, optimizer=optimizer,
                         weight_decay=0.05)
    start = factory.build_model(config, len(TARGET_CLASSES), TARGET_CLASSES)  # same seed as fit: same new head
    result = train.fit(config, bundle=target_bundle(), progress=False, verbose=False)
    backbone_before, head_before = split_state(start)
    backbone_after, head_after = split_state(result.model)
    assert_equal_states(backbone_after, backbone_before)  # weights, decay, running mean/var: untouched
    assert not torch.equal(head_after["fc.weight"], head_before["fc.weight"])


def test_unfreezing_trains_every_parameter_again(tmp_path):
    path, saved = save_source_checkpoint(tmp_path)
    config = tiny_config(tmp_path, checkpoint=str(path), freeze_backbone_epochs=1, epochs=2)
    result = train.fit(config, bundle=target_bundle(), progress=False, verbose=False)
    assert all(parameter.requires_grad for parameter in result.model.parameters())
    backbone_after, _ = split_state(result.model)
    unchanged = [name for name, value in backbone_after.items() if value.is_floating_point()
                 and torch.equal(value, saved[name])]
    assert not unchanged, f"not trained after unfreezing: {unchanged[:5]}"


def backbone_and_head_trainable(model):
    head = {id(p) for p in model.get_classifier().parameters()}
    backbone = {p.requires_grad for p in model.parameters() if id(p) not in head}
    return backbone, {p.requires_grad for p in model.get_classifier().parameters()}


def backbone_batchnorm_training(model):
    head = {id(m) for m in model.get_classifier().modules()}
    return {m.training for m in model.modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and id(m) not in head}


def test_freezer_unfreezes_at_the_first_epoch_after_the_frozen_ones():
    model = timm.create_model("test_resnet", num_classes=3)
    freezer = freeze.BackboneFreezer(epochs=2)
    assert freezer.start(model, start_epoch=0)
    assert backbone_and_head_trainable(model) == ({False}, {True})
    model.train()
    freezer.hold_batchnorm()
    assert backbone_batchnorm_training(model) == {False}  # the source's statistics are kept
    assert [freezer.maybe_unfreeze(epoch) for epoch in (0, 1)] == [False, False]
    assert backbone_and_head_trainable(model) == ({False}, {True})
    assert freezer.maybe_unfreeze(2) is True  # epoch 3: everything trains
    assert backbone_and_head_trainable(model) == ({True}, {True})
    model.train()
    freezer.hold_batchnorm()
    assert backbone_batchnorm_training(model) == {True}
    assert freezer.maybe_unfreeze(3) is False  # unfreezes once


@pytest.mark.parametrize("epochs, start_epoch", [(0, 0), (2, 2), (2, 5)])
def test_freezer_leaves_the_model_alone_outside_the_frozen_epochs(epochs, start_epoch):
    model = timm.create_model("test_resnet", num_classes=3)
    freezer = freeze.BackboneFreezer(epochs)
    assert freezer.start(model, start_epoch) is False  # a resumed run past the frozen epochs too
    assert backbone_and_head_trainable(model) == ({True}, {True})
    assert freezer.maybe_unfreeze(start_epoch) is False


def test_backbone_learning_rate_is_scaled_and_decays_with_the_head():
    from course_lib.engine.schedule import make_optimizer, make_scheduler

    model = timm.create_model("test_resnet", num_classes=3)
    config = make_config(None, optimizer="adamw", lr=1e-3, backbone_lr_scale=0.1, epochs=2)
    optimizer = freeze.scale_backbone_lr(make_optimizer(model, config), model, config.backbone_lr_scale)
    head = {id(p) for p in model.get_classifier().parameters()}
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    scheduler = make_scheduler(optimizer, config, steps_per_epoch=5)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    for group in optimizer.param_groups:
        is_head = all(id(p) in head for p in group["params"])
        assert all((id(p) in head) == is_head for p in group["params"])  # no group mixes head and backbone
        expected = 1e-3 if is_head else 1e-4
        assert group["lr"] == pytest.approx(expected * optimizer.param_groups[0]["lr"] / 1e-3)
    assert all(id(p) in head for p in optimizer.param_groups[0]["params"])  # the logged lr is the head's


@pytest.mark.parametrize("name, value", [("freeze_backbone_epochs", -1), ("backbone_lr_scale", 0.0)])
def test_bad_transfer_fields_are_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        make_config(None, **{name: value})
