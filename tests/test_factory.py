"""`models.factory`: a checkpoint with another head loads its backbone exactly, another model's
checkpoint is a one-line error, a checkpoint start asks for no pretrained weights. Tiny timm models
on CPU."""
import pytest
import timm
import torch
from conftest import (
    SOURCE_CLASSES,
    TARGET_CLASSES,
    assert_equal_states,
    save_source_checkpoint,
    split_state,
    tiny_config,
)

from course_lib.config import ConfigError
from course_lib.models import checkpoint, factory, hub


@pytest.mark.parametrize("classes, head", [(TARGET_CLASSES, "new"), ([f"other{i}" for i in range(5)], "new"),
                                           (SOURCE_CLASSES, "kept")])
def test_checkpoint_loads_the_backbone_exactly_and_replaces_a_foreign_head(tmp_path, classes, head):
    path, saved = save_source_checkpoint(tmp_path)
    model = factory.build_model(tiny_config(tmp_path, checkpoint=str(path)), len(classes), classes)
    backbone, head_state = split_state(model)
    assert_equal_states(backbone, {k: v for k, v in saved.items() if k in backbone})
    assert model.get_classifier().out_features == len(classes)
    if head == "kept":
        assert_equal_states(head_state, {k: v for k, v in saved.items() if k in head_state})
    else:
        assert not torch.equal(head_state["fc.weight"], saved["fc.weight"][:len(classes)])


def test_checkpoint_of_another_model_is_a_one_line_error(tmp_path):
    path, _ = save_source_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="holds a test_resnet, not a resnet18; set model=test_resnet"):
        factory.build_model(tiny_config(tmp_path, model="resnet18", checkpoint=str(path)), 3, TARGET_CLASSES)
    model = timm.create_model("test_vit", num_classes=3)
    with pytest.raises(checkpoint.CheckpointError, match="does not fit") as error:
        factory.load_backbone(model, path, TARGET_CLASSES)
    assert "\n" not in str(error.value)


def test_a_checkpoint_start_does_not_ask_for_pretrained_weights(tmp_path, monkeypatch):
    path, _ = save_source_checkpoint(tmp_path)
    monkeypatch.setattr(hub, "hub_reachable", lambda *args: pytest.fail("went to the hub"))
    factory.build_model(tiny_config(tmp_path, pretrained=True, checkpoint=str(path)), 3, TARGET_CLASSES)
