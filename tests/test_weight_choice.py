"""Notebook 07 section 7 (`chapters.weight_choice`): the section's runs and validation halves, SWA's share of the
epochs, scoring the weights a run kept, the table and the claims on early stopping, best.pt and SWA."""
from types import SimpleNamespace

import pytest
import torch

from course_lib.chapters import weight_choice
from course_lib.config import make_config


def weight_runs(gains, stopped=(4, None, 5), epochs_trained=(5, 6, 6)):
    """A WeightChoice with three seeds: the full run's last weights at 60/61/62 %, each other weight
    `gains[weights]` points above them; the early-stopping run's best.pt likewise ("early")."""
    rows = []
    for seed in range(3):
        last = 60.0 + seed
        for weights in ("last", "EMA", "SWA", "best.pt"):
            rows.append({"run": "full", "weights": weights, "seed": seed, "top-1 %": last + gains.get(weights, 0.0)
                         + (0.1 * seed if weights != "last" else 0.0), "loss": 1.0, "epochs trained": 6,
                         "best epoch": 5, "stopped after": None, "train s": 1.0})
        for weights in ("last", "best.pt"):
            rows.append({"run": "early stopping", "weights": weights, "seed": seed,
                         "top-1 %": last + gains["early"] + 0.1 * seed, "loss": 1.0,
                         "epochs trained": epochs_trained[seed], "best epoch": 3, "stopped after": stopped[seed],
                         "train s": 1.0})
    config = make_config("smoke", epochs=6)
    return weight_choice.WeightChoice(config, None, None, [None] * 100, {}, swa_epochs=2, patience=2, rows=rows)


def test_weight_choice_claims_follow_the_paired_intervals():
    choice = weight_runs({"EMA": 0.5, "SWA": 2.0, "best.pt": -2.0, "early": 0.0})
    found = {claim.key: claim for claim in weight_choice.claims(choice)}
    assert found["swa_gain"].verdict == "holds" and found["swa_gain"].measured == pytest.approx(2.1)
    assert found["best_checkpoint_gain"].verdict == "refuted"
    assert found["early_stopping"].verdict == "holds"  # stopped on 2 of 3 seeds, not lower beyond noise
    assert "2 of 3 seeds" in found["early_stopping"].reason
    table = choice.table()
    assert table.loc[("full", "SWA"), "verdict"] == "higher" and table.loc[("full", "SWA"), "stopped early"] == "0 of 3"
    assert table.loc[("early stopping", "best.pt"), "epochs trained"] == pytest.approx(17 / 3)


def test_early_stopping_that_never_stopped_is_not_shown_and_a_loss_refutes_it():
    never = weight_runs({"early": 0.0}, stopped=(None, None, None), epochs_trained=(6, 6, 6))
    assert weight_choice.claims(never)[0].verdict == "not shown beyond noise"
    worse = weight_runs({"early": -3.0})
    assert weight_choice.claims(worse)[0].verdict == "refuted"


def test_swa_epochs_for_and_the_validation_halves():
    assert [weight_choice.swa_epochs_for(e) for e in (2, 3, 6, 8, 40)] == [1, 1, 2, 2, 10]
    choosing, held_out = weight_choice.split_validation(_Numbered(10))
    assert len(choosing) == len(held_out) == 5 and not set(choosing.indices) & set(held_out.indices)
    capped = weight_choice.split_validation(_Numbered(10), limit=2)
    assert [len(part) for part in capped] == [2, 2]


class _Numbered(torch.utils.data.Dataset):
    classes = ["a"]

    def __init__(self, count):
        self.targets = [0] * count

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return torch.zeros(3, 2, 2, dtype=torch.uint8), 0


def test_the_study_halves_validation_and_plans_two_runs_per_seed(tmp_path):
    choice = weight_choice.study(make_config("smoke", output_dir=str(tmp_path)), "smoke")
    assert choice.config.epochs == 3 and choice.swa_epochs == weight_choice.swa_epochs_for(3) == 1
    assert len(choice.choosing) == len(choice.held_out) == len(choice.bundle.val) // 2
    assert not set(choice.choosing.indices) & set(choice.held_out.indices)
    assert list(choice.plans) == ["full", "early stopping"]
    full, early = choice.plans.values()
    assert 0 < full["ema_decay"] < 1 and full["swa_epochs"] == 1 and full["save_best"] and early["save_best"]
    assert early["early_stopping_patience"] == weight_choice.EARLY_STOPPING_PATIENCE
    assert choice.folder("early stopping", 2) == f"{tmp_path}/07_weights_early_stopping_seed2"


def test_record_scores_every_kept_weight_on_the_held_out_half(monkeypatch):
    from course_lib.models import factory

    logits = torch.eye(3) * 4.0
    held_out = [(row.view(3, 1, 1), label) for label, row in enumerate(logits)]
    choice = weight_choice.WeightChoice(make_config("smoke", batch_size=2), SimpleNamespace(device_stage=None), None,
                                        held_out, {}, swa_epochs=1)
    monkeypatch.setattr(factory, "model_from_checkpoint", lambda path: torch.nn.Flatten())  # best.pt: right
    history = [{"images_per_second": 100.0, "epoch_seconds": 2.0}] * 2
    result = SimpleNamespace(model=torch.nn.Flatten(), ema_model=None, swa_model=torch.nn.Flatten(), history=history,
                             config=make_config("smoke", seed=4), best_epoch=2, stopped_early_after=None,
                             best_checkpoint_path="best.pt")
    choice.record("full", result)
    assert [(row["weights"], row["top-1 %"], row["seed"]) for row in choice.rows] == \
        [("last", 100.0, 4), ("SWA", 100.0, 4), ("best.pt", 100.0, 4)]  # no EMA kept: no EMA row
    assert choice.rows[0]["epochs trained"] == 2 and choice.rows[0]["train s"] == 4.0 and choice.seconds > 0
