"""`models.hub`: pretrained weights that cannot be had offline give a one-line error that names the fixes."""
import pytest
from conftest import tiny_config

from course_lib.models import factory, hub


def assert_one_line_fix(error):
    message = str(error.value)
    assert "\n" not in message
    for fix in ("be online once", "HF_HUB_OFFLINE=1", "checkpoint=<path>"):
        assert fix in message


def test_offline_without_cache_is_a_one_line_error_without_waiting(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert not hub.pretrained_available("test_resnet")
    with pytest.raises(hub.PretrainedWeightsError) as error:
        factory.build_model(tiny_config(tmp_path, pretrained=True), 3)
    assert_one_line_fix(error)


def test_what_timm_raises_offline_is_translated(tmp_path, monkeypatch):
    """Past the quick check (say the cache looked filled), timm's own error is what the user sees."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(hub, "weights_cached", lambda name: True)
    with pytest.raises(hub.PretrainedWeightsError, match="LocalEntryNotFoundError") as error:
        factory.create_model("test_resnet", 3, pretrained=True)
    assert_one_line_fix(error)
