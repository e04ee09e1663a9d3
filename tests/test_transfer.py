"""Transfer learning: a checkpoint with another head loads its backbone exactly, frozen epochs
change only the head, unfreezing trains everything, and pretrained weights that cannot be had
offline give a one-line error. Tiny timm models on CPU."""
import pytest
import timm
import torch
from conftest import TensorImages, tiny_config

from course_lib import paths
from course_lib.chapters import transfer_plans
from course_lib.config import ConfigError, make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import freeze, train
from course_lib.models import checkpoint, factory, hub

SOURCE_CLASSES = [f"source{i}" for i in range(5)]
TARGET_CLASSES = [f"target{i}" for i in range(3)]


def target_bundle(count=48):
    return DataBundle(TensorImages(count, len(TARGET_CLASSES)), TensorImages(12, len(TARGET_CLASSES), seed=1), None,
                      TARGET_CLASSES, "tensors")


def save_source_checkpoint(tmp_path, classes=SOURCE_CLASSES, model_name="test_resnet"):
    """A checkpoint of a model with `len(classes)` outputs and non-default weights and BN statistics."""
    torch.manual_seed(1)
    model = timm.create_model(model_name, num_classes=len(classes))
    with torch.no_grad():  # as if trained: moved weights, running statistics that are not 0 and 1
        for name, tensor in model.state_dict().items():
            if name.endswith("running_var"):
                tensor.mul_(1 + torch.rand_like(tensor))
            elif tensor.is_floating_point():
                tensor.add_(0.01 * torch.randn_like(tensor))
    config = tiny_config(tmp_path, model=model_name)
    path = checkpoint.save_checkpoint({"model": model.state_dict(), "config": config.to_dict(),
                                       "classes": list(classes), "epoch": 1}, tmp_path / "source.pt")
    return path, {k: v.clone() for k, v in model.state_dict().items()}


def split_state(model):
    """(backbone state incl. BatchNorm statistics, head state), cloned."""
    head_names = {name for name, _ in model.get_classifier().named_parameters()}
    prefix = next(n for n, m in model.named_modules() if m is model.get_classifier())
    head_keys = {f"{prefix}.{name}" for name in head_names}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return ({k: v for k, v in state.items() if k not in head_keys}, {k: v for k, v in state.items() if k in head_keys})


def assert_equal_states(first, second):
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


# --- a new head on a loaded backbone ------------------------------------------------------------

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


# --- freezing, then unfreezing --------------------------------------------------------------------

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


# --- pretrained weights offline ---------------------------------------------------------------------

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


def test_a_checkpoint_start_does_not_ask_for_pretrained_weights(tmp_path, monkeypatch):
    path, _ = save_source_checkpoint(tmp_path)
    monkeypatch.setattr(hub, "hub_reachable", lambda *args: pytest.fail("went to the hub"))
    factory.build_model(tiny_config(tmp_path, pretrained=True, checkpoint=str(path)), 3, TARGET_CLASSES)


# --- reading the runs ---------------------------------------------------------------------------------

def test_time_to_target_counts_training_seconds_until_first_reached():
    history = [{"epoch": 1, "epoch_seconds": 2.0, "val_top1": 0.5}, {"epoch": 2, "epoch_seconds": 3.0, "val_top1": 0.8},
               {"epoch": 3, "epoch_seconds": 4.0, "val_top1": 0.7}]
    assert transfer_plans.time_to_target(history, 0.8) == {"epochs": 2, "seconds": pytest.approx(5.0)}
    assert transfer_plans.time_to_target(history, 0.9) == {"epochs": None, "seconds": None}


def test_plan_without_weights_or_eurosat_pretrains_on_the_samples_other_classes(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "pretrained_available", lambda name: False)
    monkeypatch.setenv(paths.DATA_ENV, "none")  # hides every real dataset
    plan = transfer_plans.plan_transfer(tiny_config(tmp_path), source_epochs=2)
    assert (plan.source, plan.target, plan.synthetic) == ("classes", "landcover-synth", True)
    assert plan.source_config.dataset == "landcover-synth" and plan.source_config.epochs == 2
    assert plan.source_config.output_dir != plan.target_config.output_dir
    assert "synthetic" in plan.reason
    digits = transfer_plans.plan_transfer(tiny_config(tmp_path), source="digits")
    assert digits.source_config.dataset == "digits" and digits.source_config.storage == "files"
    with pytest.raises(ConfigError, match="source='landcover-synth' is not one of"):
        transfer_plans.plan_transfer(tiny_config(tmp_path), source="landcover-synth")
    with pytest.raises(FileNotFoundError, match="target=eurosat needs real EuroSAT .*workbook data get eurosat"):
        transfer_plans.plan_transfer(tiny_config(tmp_path), target="eurosat")


def test_plan_with_eurosat_is_real_data(tmp_path, eurosat_dir, monkeypatch):
    monkeypatch.setattr(hub, "pretrained_available", lambda name: False)
    plan = transfer_plans.plan_transfer(tiny_config(tmp_path))
    assert (plan.source, plan.target, plan.synthetic) == ("classes", "eurosat", False)
    assert plan.data_config.data_dir == str(eurosat_dir) and plan.data_config.max_train_images == 0


def _source_bundle():
    return DataBundle(TensorImages(32, len(SOURCE_CLASSES)), TensorImages(10, len(SOURCE_CLASSES), seed=1), None,
                      SOURCE_CLASSES, "tensors")


def test_source_checkpoint_is_reused_while_its_config_matches(tmp_path):
    config = tiny_config(tmp_path, output_dir=str(tmp_path / "source"))
    extra = {"classes": SOURCE_CLASSES}
    first = transfer_plans.source_checkpoint(config, _source_bundle(), extra=extra)
    assert not first["reused"] and f"source-{first['digest']}" in first["checkpoint"]
    again = transfer_plans.source_checkpoint(config.replace(num_workers=0), _source_bundle(), extra=extra)
    assert again["reused"] and again["checkpoint"] == first["checkpoint"] and again["digest"] == first["digest"]
    changed = transfer_plans.source_checkpoint(config.replace(epochs=2), _source_bundle(), extra=extra)
    assert not changed["reused"] and changed["digest"] != first["digest"] and changed["epochs"] == 2
    other_classes = transfer_plans.source_checkpoint(config, _source_bundle(), extra={"classes": SOURCE_CLASSES[::-1]})
    assert not other_classes["reused"]


def test_config_digest_ignores_bookkeeping_only(tmp_path):
    config = tiny_config(tmp_path)
    digest = checkpoint.config_digest(config.to_dict())
    assert digest == checkpoint.config_digest(config.replace(output_dir="elsewhere", num_workers=1).to_dict())
    assert digest != checkpoint.config_digest(config.replace(lr=0.01).to_dict())
    assert digest != checkpoint.config_digest({**config.to_dict(), "classes": ["a"]})


def test_target_batch_size_leaves_two_steps_per_epoch():
    assert transfer_plans.target_batch_size(30, 128) == 15
    assert transfer_plans.target_batch_size(600, 128) == 128
    assert transfer_plans.target_batch_size(3, 64) == 1


def _rows(scratch, transferred, images=1000):
    rows = [{"labels per class": 10, "strategy": "from scratch", "seed": i, "validation images": images,
             "final val top-1": value} for i, value in enumerate(scratch)]
    return rows + [{"labels per class": 10, "strategy": "fine-tune all", "seed": i, "validation images": images,
                    "final val top-1": value} for i, value in enumerate(transferred)]


def test_verdict_beats_only_beyond_seed_noise():
    clear = transfer_plans.transfer_verdict(_rows([0.60, 0.62, 0.61], [0.80, 0.81, 0.79]))
    assert clear.loc[(10, "fine-tune all"), "verdict"] == "beats from scratch beyond seed noise"
    assert clear.loc[(10, "fine-tune all"), "delta vs scratch"] == pytest.approx(0.19)
    noisy = transfer_plans.transfer_verdict(_rows([0.50, 0.70, 0.60], [0.55, 0.75, 0.68]))
    assert noisy.loc[(10, "fine-tune all"), "verdict"] == "within seed noise"
    worse = transfer_plans.transfer_verdict(_rows([0.80, 0.81, 0.79], [0.60, 0.62, 0.61]))
    assert worse.loc[(10, "fine-tune all"), "verdict"] == "worse than from scratch beyond seed noise"
    # Seeds that happen to agree: the binomial floor (30 validation images) keeps a 3-point gap within noise.
    agreeing = transfer_plans.transfer_verdict(_rows([0.60, 0.60, 0.60], [0.63, 0.63, 0.63], images=30))
    assert agreeing.loc[(10, "fine-tune all"), "verdict"] == "within seed noise"


def test_difference_beyond_noise_closed_form():
    from course_lib.analysis import statistics

    test = statistics.difference_beyond_noise([3.0, 5.0], [1.0, 1.0, 1.0])
    assert test["delta"] == pytest.approx(3.0)
    assert test["band"] == pytest.approx(2 * (2.0 / 2) ** 0.5)  # z * sqrt(s^2/n + 0/3), s^2 = 2
    assert test["beyond"] == 1
    assert statistics.difference_beyond_noise([2.0, 4.0], [1.0, 1.0, 1.0])["beyond"] == 0  # delta 2 = band 2
    single = statistics.difference_beyond_noise([10.0], [1.0, 3.0])  # one run borrows the other's std
    assert single["band"] == pytest.approx(2 * (2.0 + 1.0) ** 0.5) and single["beyond"] == 1
    with pytest.raises(ValueError, match="2 or more"):
        statistics.difference_beyond_noise([1.0], [2.0])


def test_label_grid_trains_every_strategy_label_count_and_seed(tmp_path):
    whole = DataBundle(TensorImages(60, 5), TensorImages(20, 5, seed=1), None, SOURCE_CLASSES, "tensors")
    whole.train.classes = whole.val.classes = SOURCE_CLASSES
    config = tiny_config(tmp_path, epochs=2, optimizer="adamw", lr=1e-3)
    strategies = {"from scratch": config, "fine-tune all": config.replace(lr=1e-4)}
    rows, results = transfer_plans.label_grid(strategies, whole, SOURCE_CLASSES[:2], [2, 4], [0, 1], echo=None)
    assert len(rows) == len(results) == 8
    assert {(r["labels per class"], r["training images"], r["batch"]) for r in rows} == {(2, 4, 2), (4, 8, 4)}
    assert all(r["validation images"] == 8 for r in rows)  # 20 images of 5 classes: 4 each, 2 classes
    curves = transfer_plans.mean_curves(results, 4)
    assert set(curves) == set(strategies) and curves["from scratch"]["epoch"] == [1, 2]
    table = transfer_plans.curve_table(curves, 0.0)
    assert (table["epochs to target"] == 1).all()
    verdict = transfer_plans.transfer_verdict(rows)
    assert list(verdict.index.get_level_values(0).unique()) == [2, 4]


class _Fit:
    """A stand-in for train.fit's result: a history of (val top-1, epoch seconds)."""

    def __init__(self, accuracies, seconds=1.0):
        self.history = [{"epoch": i + 1, "val_top1": a, "epoch_seconds": seconds} for i, a in enumerate(accuracies)]
        self.final = self.history[-1]


def _grid(fine_tune_curve, frozen_curve, scratch_curve=(0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.88, 0.88, 0.89, 0.9),
          seeds=3):
    results, rows = {}, []
    for seed in range(seeds):
        for name, curve in (("from scratch", scratch_curve), ("fine-tune all", fine_tune_curve),
                            ("freeze, then unfreeze", frozen_curve)):
            shifted = [min(1.0, a + 0.01 * seed) for a in curve]
            results[(200, name, seed)] = _Fit(shifted)
            rows.append({"labels per class": 200, "strategy": name, "seed": seed, "validation images": 300,
                         "final val top-1": shifted[-1]})
    return results, transfer_plans.transfer_verdict(rows)


def test_training_saved_is_per_seed_against_the_same_seeds_scratch_run():
    results, _ = _grid((0.85, 0.9, 0.93, 0.94, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95), [0.5] * 10)
    saved = transfer_plans.training_saved(results, 200, "fine-tune all")
    assert [s["epochs"] for s in saved] == [2, 2, 2] and saved[0]["epochs saved"] == pytest.approx(0.8)
    never = transfer_plans.training_saved(results, 200, "freeze, then unfreeze")
    assert not any(s["reached"] for s in never) and all(s["epochs saved"] == 0 for s in never)


def test_transfer_claims_measure_the_share_saved_with_an_interval(monkeypatch):
    from course_lib.analysis import claims

    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    results, verdict = _grid((0.85, 0.9, 0.93, 0.94, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95),
                             (0.6, 0.7, 0.8, 0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.9))
    found = transfer_plans.claims_table(results, verdict, source_seconds=30.0, setting="a test")
    assert [c.key for c in found] == ["transfer_learning", "transfer_beats_scratch", "transfer_freeze_recipe"]
    share = found[0]
    assert share.measured == pytest.approx(80.0) and share.low <= 80.0 <= share.high
    assert share.verdict == claims.HOLDS and "fine-tune all" in share.reason and "30 s of source" in share.reason
    assert found[1].verdict == claims.HOLDS  # 0.95 vs 0.90 on every seed
    assert found[2].verdict == claims.REFUTED  # 5 points worse than fine-tune all on every seed
    # Fine-tuning that learns as slowly as from scratch saves nothing: the claim is refuted.
    slow, verdict = _grid((0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.88, 0.88, 0.89, 0.9), [0.2] * 10)
    assert transfer_plans.claims_table(slow, verdict)[0].verdict == claims.REFUTED
