"""The criterion: cross-entropy with the config's label smoothing (closed form), or timm's
SoftTargetCrossEntropy when MixUp/CutMix make soft targets."""
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config
from timm.loss import SoftTargetCrossEntropy

from course_lib.engine.label_smoothing import make_criterion


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_label_smoothing_matches_the_closed_form(tmp_path, epsilon):
    criterion = make_criterion(tiny_config(tmp_path, label_smoothing=epsilon))
    assert isinstance(criterion, torch.nn.CrossEntropyLoss) and criterion.label_smoothing == epsilon
    logits, targets = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 3, 0, 1])
    log_probabilities = F.log_softmax(logits, dim=1)
    # (1 - eps) x cross-entropy with the true class + eps x mean over all classes of -log p
    expected = ((1 - epsilon) * -log_probabilities[torch.arange(6), targets]
                + epsilon * -log_probabilities.mean(dim=1)).mean()
    assert criterion(logits, targets).item() == pytest.approx(expected.item(), rel=1e-6)


def test_soft_targets_when_mixing(tmp_path):
    criterion = make_criterion(tiny_config(tmp_path, label_smoothing=0.1, mixup_alpha=0.2), mixing=True)
    assert isinstance(criterion, SoftTargetCrossEntropy)
