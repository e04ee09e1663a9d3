"""The weight EMA: the config's decay builds timm's ModelEmaV3 (or nothing), and an update is
ema = decay x ema + (1 - decay) x weights."""
import pytest
import torch
from conftest import tiny_config
from timm.utils import ModelEmaV3

from course_lib.engine.ema import make_ema


def test_update_is_the_exponential_average(tmp_path):
    model = torch.nn.Linear(3, 2)
    ema = make_ema(model, tiny_config(tmp_path, ema_decay=0.9))
    assert isinstance(ema, ModelEmaV3) and ema.decay == 0.9 and ema.module is not model
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model, step=10)
    torch.testing.assert_close(ema.module.weight, 0.9 * start + 0.1 * (start + 1.0))


def test_off_when_the_decay_is_zero(tmp_path):
    assert make_ema(torch.nn.Linear(3, 2), tiny_config(tmp_path)) is None


@pytest.mark.parametrize("decay", [0.5, 0.999])
def test_first_global_step_copies_the_weights(tmp_path, decay):
    """timm's rule, which the engine relies on: step 1 (the first update) starts the average at the weights."""
    model = torch.nn.Linear(3, 2)
    ema = make_ema(model, tiny_config(tmp_path, ema_decay=decay))
    with torch.no_grad():
        model.weight.mul_(2.0)
    ema.update(model, step=1)
    torch.testing.assert_close(ema.module.weight, model.weight)
