import pytest
import torch

from course_lib.chapters import troubleshoot
from course_lib.config import ConfigError, make_config
from course_lib.data import datasets, pipeline, scan
from course_lib.models import checkpoint


@pytest.fixture
def config(tmp_path):
    return make_config("smoke", model="test_resnet", batch_size=8, output_dir=str(tmp_path / "ckpt"))


def test_preflight_passes_and_loss_falls_on_a_good_setup(config):
    report = troubleshoot.preflight(config, steps=4)
    assert report.ok, report.problems
    assert report.steps == 4 and len(report.losses) == 4
    assert report.loss_decreased and report.losses[-1] < report.losses[0]
    assert report.images_per_second > 0 and report.peak_memory_bytes > 0
    assert report.summary()["problems"] == "none"


def test_preflight_reports_a_nan_loss_as_one_line(config):
    report = troubleshoot.preflight(config.replace(lr=1e6), steps=3)
    assert not report.ok
    assert report.error.startswith("NonFiniteLossError") and "learning rate" in report.error
    assert "pre-flight step" in report.error
    assert "\n" not in report.error


def test_preflight_reports_a_bad_model_name(config):
    report = troubleshoot.preflight(config.replace(model="no_such_model_xyz"), steps=2)
    assert not report.ok and "unknown timm model" in report.error


def test_preflight_flags_a_loss_that_does_not_fall(config):
    report = troubleshoot.preflight(config.replace(lr=1e-9, min_lr=0.0), steps=3)  # nothing learns at lr 1e-9
    assert not report.loss_decreased and not report.ok
    assert "did not fall" in report.problems[0]


def test_preflight_needs_two_steps(config):
    with pytest.raises(ConfigError, match="at least 2 steps"):
        troubleshoot.preflight(config, steps=1)


def test_tiny_bundle_takes_every_class(config):
    bundle = troubleshoot.tiny_bundle(config, 8)
    labels = [bundle.train[i][1] for i in range(len(bundle.train))]
    assert len(labels) == 8 and len(set(labels)) == 8 and bundle.val is None


def test_error_message():
    assert troubleshoot.error_message(lambda: 1) is None
    assert troubleshoot.error_message(int, "x").startswith("ValueError: invalid literal")


def test_wrong_normalization_is_visible_in_input_statistics(config):
    bundle = pipeline.build_datasets(config)
    good = troubleshoot.input_statistics(bundle.train, images=8)
    raw = troubleshoot.input_statistics(troubleshoot.Renormalized(bundle.train, "raw"), images=8)
    unit = troubleshoot.input_statistics(troubleshoot.Renormalized(bundle.train, "unit"), images=8)
    assert abs(good["mean"]) < 2 and troubleshoot.normalization_verdict(good).startswith("normalized")
    assert 20 < raw["mean"] < 255 and raw["max"] <= 255.0 + 1e-3 and raw["min"] >= -1e-3
    assert "0-255" in troubleshoot.normalization_verdict(raw)
    assert 0 <= unit["min"] and unit["max"] <= 1 + 1e-6
    assert troubleshoot.normalization_verdict(unit).startswith("not normalized")
    wrong = troubleshoot.wrong_normalization_bundle(bundle, "raw", splits=("val",))
    assert wrong.train is bundle.train and isinstance(wrong.val, troubleshoot.Renormalized)
    with pytest.raises(ConfigError):
        troubleshoot.Renormalized(bundle.train, "other")


def test_slow_dataset_sleeps_per_item():
    import time

    slow = troubleshoot.SlowDataset([(0, 1), (2, 3)], delay_seconds=0.02)
    start = time.perf_counter()
    assert slow[1] == (2, 3) and len(slow) == 2
    assert time.perf_counter() - start >= 0.02


def test_broken_folder_fails_skips_and_scans(tmp_path):
    made = troubleshoot.make_broken_folder(tmp_path / "broken", per_class=3, classes=2)
    failing = datasets.ImageFolderDataset(made["folder"], bad_images="fail")
    message = troubleshoot.error_message(lambda: [failing[i] for i in range(len(failing))])
    assert message.startswith("BadImageError") and "bad_images=skip" in message
    skipping = datasets.ImageFolderDataset(made["folder"], bad_images="skip")
    items = [skipping[i] for i in range(len(skipping))]
    assert len(items) == 7 and len(skipping.skipped) == 3
    checked, problems = scan.scan_folder(made["folder"])
    assert checked == 7 and {p.kind for p in problems} >= {"zero-byte", "truncated"}
    assert len({p.path for p in problems}) == 3


def test_untrusted_and_truncated_checkpoints_are_refused(tmp_path):
    untrusted = troubleshoot.write_untrusted_checkpoint(tmp_path / "untrusted.pt")
    with pytest.raises(checkpoint.CheckpointError, match="refusing"):
        checkpoint.load_checkpoint(untrusted)
    good = checkpoint.save_checkpoint({"model": {"w": torch.ones(1000)}}, tmp_path / "good.pt")
    truncated = troubleshoot.write_truncated_checkpoint(good, tmp_path / "truncated.pt")
    with pytest.raises(checkpoint.CheckpointError, match="not a readable"):
        checkpoint.load_checkpoint(truncated)


def test_data_dependent_branch_breaks_the_graph():
    example = torch.randn(2, 3, 16, 16)
    dynamic = troubleshoot.graph_breaks(troubleshoot.BranchyNet(dynamic=True), example)
    static = troubleshoot.graph_breaks(troubleshoot.BranchyNet(dynamic=False), example)
    assert dynamic["graph_breaks"] >= 1 and dynamic["graphs"] >= 2 and dynamic["reasons"]
    assert static["graph_breaks"] == 0 and static["graphs"] == 1


def test_branchy_net_variants_compute_the_same():
    torch.manual_seed(0)
    dynamic = troubleshoot.BranchyNet(dynamic=True)
    static = troubleshoot.BranchyNet(dynamic=False)
    static.load_state_dict(dynamic.state_dict())
    images = torch.randn(3, 3, 16, 16)
    assert torch.allclose(dynamic(images), static(images), atol=1e-6)


def test_epoch_orders_repeat_without_set_epoch():
    forgotten = troubleshoot.epoch_orders(40, world_size=2, epochs=3, call_set_epoch=False)
    remembered = troubleshoot.epoch_orders(40, world_size=2, epochs=3, call_set_epoch=True)
    assert forgotten[0] == forgotten[1] == forgotten[2]
    assert remembered[0] != remembered[1] and remembered[1] != remembered[2]
    assert remembered[0] == forgotten[0]  # epoch 0 is the same either way


def test_plain_losses_diverge_on_raw_pixels_without_batchnorm(config):
    bundle = pipeline.build_datasets(config)
    good = troubleshoot.plain_sgd_losses(bundle.train, lr=0.05, steps=6)
    raw = troubleshoot.plain_sgd_losses(troubleshoot.Renormalized(bundle.train, "raw"), lr=0.05, steps=6)
    assert len(good) == 6 and max(good) < 5
    assert max(raw) > 100 * max(good)


def test_claims_from_the_reproduced_failures(monkeypatch):
    import types

    import pandas as pd

    from course_lib.analysis import claims

    monkeypatch.setattr(claims, "_hardware", lambda: "fake machine")
    breaks = pd.DataFrame({"python if": {"graphs": 2, "graph_breaks": 1}, "torch.where": {"graphs": 1, "graph_breaks": 0}}).T
    compile_rows = pd.DataFrame({"torch.where": {"first_compiled_seconds": 25.0, "compiled_seconds": 0.01}}).T
    report = types.SimpleNamespace
    reports = {"this configuration": report(ok=True, steps=5, seconds=2.0), "lr 1e4": report(ok=False),
               "typo": report(ok=False)}
    orders = pd.DataFrame({"with set_epoch": ["[1, 2]", "[2, 1]", "[0, 3]"], "without set_epoch": ["[1, 2]"] * 3})
    starve = pd.DataFrame({"data wait": [0.8, 0.1], "images/s": [10.0, 50.0]}, index=["num_workers=0", "num_workers=2"])
    found = {c.key: c for c in troubleshoot.claims(breaks, compile_rows, "first call 25 s", reports, orders,
                                                   [{"advice": "driver too old"}], starve, 10.0)}
    assert list(found) == ["compile_static_control_flow", "compile_first_call_slow", "preflight_catches_errors",
                           "set_epoch_reshuffles", "driver_matches_cuda", "workers0_starves"]
    assert all(c.verdict == claims.HOLDS for key, c in found.items() if key != "driver_matches_cuda")
    assert found["driver_matches_cuda"].verdict == claims.DEMONSTRATED  # the doctor's rule on a made-up driver
    skipped = troubleshoot.claims(breaks, None, "not measured in smoke", reports, orders, [], starve, 10.0)
    assert skipped[1].verdict == claims.NOT_MEASURABLE and skipped[4].verdict == claims.REFUTED
    # The container rule on made-up broken machines: demonstrated when each gets its own cause, refuted when not.
    from course_lib.measure import container_runtime

    shown = troubleshoot.claims(breaks, None, "-", reports, orders, [], starve, 10.0,
                                container=container_runtime.diagnoses_each_broken_machine())[-1]
    assert shown.key == "container_gpu_access" and shown.verdict == claims.DEMONSTRATED and "3 of 3" in shown.reason
    wrong = {name: list(container_runtime.FAILURE_MODES) for name in container_runtime.FAILURE_MODES}  # blames all
    assert troubleshoot.claims(breaks, None, "-", reports, orders, [], starve, 10.0,
                               container=wrong)[-1].verdict == claims.REFUTED
