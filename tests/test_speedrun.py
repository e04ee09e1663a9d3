"""The speed-run network: registered with timm, the documented size, timm's head interface."""
import timm
import torch

from course_lib.config import make_config
from course_lib.models import factory, speedrun


def test_building_by_name_registers_it_without_importing_the_module_first():
    """A fresh interpreter that only asks the factory for the model by name (as `workbook train` does)."""
    import subprocess
    import sys

    code = ("from course_lib.config import make_config; from course_lib.models import factory; "
            "print(type(factory.build_model(make_config('smoke', model='speedrun_resnet_small'), 3)).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "SpeedrunResNet", out.stderr[-500:]


def test_registered_with_timm_with_the_documented_parameter_count():
    assert timm.is_model("speedrun_resnet") and timm.is_model("speedrun_resnet_small")
    model = timm.create_model("speedrun_resnet", num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 1_941_066  # stated in the module docstring
    assert "1,941,066" in speedrun.__doc__
    small = timm.create_model("speedrun_resnet_small", num_classes=10)
    assert sum(p.numel() for p in small.parameters()) == 486_698
    tiny = timm.create_model("speedrun_resnet_tiny", num_classes=10)
    assert sum(p.numel() for p in tiny.parameters()) == 122_394  # 0.12 M, as its docstring says


def test_forward_shapes_and_head_interface():
    model = timm.create_model("speedrun_resnet_small", num_classes=7)
    images = torch.randn(2, 3, 64, 64)
    assert model(images).shape == (2, 7)
    assert model.forward_features(images).shape == (2, 128, 4, 4)
    assert model.get_classifier() is model.fc
    model.reset_classifier(3)
    assert model(images).shape == (2, 3) and model.num_classes == 3
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)  # any size divisible by 16


def test_the_engine_builds_it_by_name():
    config = make_config("smoke", model="speedrun_resnet_small")
    assert factory.build_model(config, 4)(torch.randn(1, 3, 32, 32)).shape == (1, 4)
