import json

import pytest
from conftest import ROOT

from course_lib.config import (
    FIELD_NAMES,
    PROFILES,
    RECIPES,
    Config,
    ConfigError,
    field_comments,
    make_config,
    parse_assignments,
    resolve_profile,
)


def test_every_field_has_a_unit_comment():
    comments = field_comments()
    assert set(comments) == set(FIELD_NAMES)
    assert all(text.strip() for text in comments.values())


@pytest.mark.parametrize("profile", ["smoke", "cpu", "gpu"])
def test_profiles_use_only_known_fields(profile):
    assert set(PROFILES[profile]) <= set(FIELD_NAMES)
    config = make_config(profile)
    for name, value in PROFILES[profile].items():
        assert getattr(config, name) == value


def test_auto_profile_follows_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_profile("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_profile("auto") == "gpu"


def test_none_overrides_keep_the_profile_value():
    assert make_config("smoke", batch_size=None).batch_size == PROFILES["smoke"]["batch_size"]
    assert make_config("smoke", batch_size=8).batch_size == 8


def test_unknown_name_lists_valid_names():
    with pytest.raises(ConfigError) as error:
        make_config("smoke", batchsize=8)
    message = str(error.value)
    assert "batchsize" in message and "batch_size" in message and "\n" not in message


@pytest.mark.parametrize("name,value", [("batch_size", "8"), ("batch_size", 8.5), ("channels_last", 1),
                                        ("lr", "fast"), ("epochs", True)])
def test_wrong_types_are_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        make_config("smoke", **{name: value})


@pytest.mark.parametrize("name,value", [("precision", "fp8"), ("optimizer", "lamb"), ("device", "tpu"),
                                        ("batch_size", 0), ("num_workers", -2), ("dataset", "imagenet"),
                                        ("decoder", "jpeg"), ("storage", "s3"), ("augmentation", "gpu")])
def test_bad_values_are_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        make_config("smoke", **{name: value})


@pytest.mark.parametrize("name,valid", [("decoder", "pil, opencv, torchvision, nvjpeg"),
                                        ("storage", "files, cache, shards, device"), ("augmentation", "cpu, device, none")])
def test_data_switches_name_their_valid_values_in_one_line(name, valid):
    with pytest.raises(ConfigError) as error:
        make_config("smoke", **{name: "nonsense"})
    assert str(error.value) == f"{name}='nonsense' is not one of {valid}"


def test_data_switch_defaults_are_todays_pipeline():
    config = make_config(None)
    assert (config.decoder, config.storage, config.augmentation) == ("pil", "files", "cpu")
    assert make_config("gpu").augmentation == "device"


def test_num_workers_minus_one_means_recommended():
    assert make_config("smoke", num_workers=-1).num_workers == -1
    assert PROFILES["cpu"]["num_workers"] == PROFILES["gpu"]["num_workers"] == -1
    with pytest.raises(ConfigError, match=r"num_workers must be 0 or more, or -1 for the recommended number.*got -2"):
        make_config("smoke", num_workers=-2)


def test_int_is_accepted_for_float_fields():
    config = make_config("smoke", lr=1)
    assert config.lr == 1.0 and isinstance(config.lr, float)


def test_parse_assignments_types_each_value():
    values = parse_assignments(["batch_size=16", "lr=3e-4", "channels_last=true", "model=resnet50"])
    assert values == {"batch_size": 16, "lr": 3e-4, "channels_last": True, "model": "resnet50"}
    with pytest.raises(ConfigError, match="name=value"):
        parse_assignments(["batch_size"])
    with pytest.raises(ConfigError, match="channels_last"):
        parse_assignments(["channels_last=maybe"])


def test_replace_is_checked():
    config = make_config("smoke")
    assert config.replace(epochs=3).epochs == 3
    with pytest.raises(ConfigError):
        config.replace(epochs="3")
    assert isinstance(config, Config)


def test_the_profiles_page_documents_every_field():
    page = (ROOT / "docs" / "profiles.md").read_text()
    missing = [name for name in FIELD_NAMES if f"| `{name}` |" not in page]
    assert not missing, f"docs/profiles.md's configuration table lacks {missing}"


def test_the_profiles_page_table_is_the_generated_one():
    """Defaults, profile values and comments in docs/profiles.md match the code; regenerate with
    `workbook docs tables`."""
    from course_lib.config import configuration_table

    table = configuration_table()
    assert table.count("\n") == len(FIELD_NAMES) + 1
    assert table in (ROOT / "docs" / "profiles.md").read_text()


def test_a_recipe_applies_over_the_profile_and_under_overrides():
    config = make_config("cpu", recipe="speedrun")
    for name, value in RECIPES["speedrun"].items():
        assert getattr(config, name) == value
    assert config.device == "cpu"  # a profile value the recipe leaves alone
    assert make_config("cpu", recipe="speedrun", tta_views=1).tta_views == 1  # one ingredient switched off
    again = make_config("cpu").replace(recipe="speedrun", epochs=3)
    assert again.model == RECIPES["speedrun"]["model"] and again.epochs == 3
    with pytest.raises(ConfigError, match="recipe='fast' is not one of speedrun, speedrun2, best"):
        make_config("cpu", recipe="fast")
    with pytest.raises(ConfigError, match="tta_views must be 1"):
        make_config("cpu", tta_views=9)


def test_the_best_recipe_is_the_speed_run_wider_longer_and_upsampled():
    speedrun, best = make_config("cpu", recipe="speedrun"), make_config("cpu", recipe="best")
    changed = {name for name in RECIPES["best"] if getattr(best, name) != getattr(speedrun, name)}
    assert changed == {"model", "epochs", "image_size", "min_image_size"}  # the rest: chosen on the carve-out
    assert best.model == "speedrun_resnet" and best.epochs > speedrun.epochs and best.ema_decay == 0
    # progressive resizing keeps the speed-run's proportion: it starts at half the final side
    assert best.image_size > speedrun.image_size and best.min_image_size * 2 == best.image_size


def test_speedrun2_is_the_speed_run_with_muon_a_doubled_batch_fewer_epochs_and_a_ramp_to_the_last_epoch():
    speedrun, quicker = make_config("cpu", recipe="speedrun"), make_config("cpu", recipe="speedrun2")
    changed = {name for name in RECIPES["speedrun2"] if getattr(quicker, name) != getattr(speedrun, name)}
    assert changed == {"optimizer", "batch_size", "lr", "muon_lr", "epochs", "resize_ramp"}
    assert quicker.optimizer == "muon" and quicker.epochs < speedrun.epochs and quicker.resize_ramp == 1.0
    assert quicker.lr / quicker.batch_size == speedrun.lr / speedrun.batch_size  # both rates scaled with the batch
    assert quicker.muon_lr / quicker.batch_size == pytest.approx(speedrun.muon_lr / speedrun.batch_size, rel=0.03)


@pytest.mark.parametrize("recipe", ["speedrun", "best"])
def test_each_recipes_committed_figures_were_measured_with_the_recipe_as_it_stands(recipe):
    """benchmarks/results/speedrun_RECIPE.json (the README's headline) ran every value the recipe sets: change a
    recipe and its 3- or 5-seed run must be measured again."""
    measured = json.loads((ROOT / "benchmarks" / "results" / f"speedrun_{recipe}.json").read_text())["config"]
    differ = {name: (value, measured.get(name)) for name, value in RECIPES[recipe].items()
              if measured.get(name) != value}
    assert not differ, f"recipe {recipe!r} vs its committed run (recipe, measured): {differ}"


def test_the_committed_side_by_side_race_ran_both_recipes_as_they_stand():
    """benchmarks/results/**/race_speedrun_vs_speedrun2.json (the README's speed-up): change either recipe and the
    race must be run again."""
    for path in (ROOT / "benchmarks" / "results").rglob("race_speedrun_vs_speedrun2.json"):
        configs = json.loads(path.read_text())["configs"]
        for recipe in ("speedrun", "speedrun2"):
            differ = {name: (value, configs[recipe].get(name)) for name, value in RECIPES[recipe].items()
                      if configs[recipe].get(name) != value}
            assert not differ, f"{path.name}: recipe {recipe!r} vs the raced one (recipe, raced): {differ}"


def test_overlays_apply_after_profile_and_recipe_and_before_params():
    sizes = {"cpu": {"epochs": 1, "image_size": 48}, "smoke": {"epochs": 7}}
    config = make_config("cpu", sizes)
    assert (config.epochs, config.image_size) == (1, 48)
    assert config.batch_size == PROFILES["cpu"]["batch_size"]  # what the overlay leaves alone
    assert make_config("smoke", sizes).epochs == 7 and make_config("gpu", sizes).epochs == PROFILES["gpu"]["epochs"]
    # later overlays win, explicit params win over every overlay, None params mean "not given"
    assert make_config("cpu", sizes, {"cpu": {"epochs": 2}}).epochs == 2
    assert make_config("cpu", sizes, epochs=5).epochs == 5
    assert make_config("cpu", sizes, epochs=None).epochs == 1
    # the overlay sits over the recipe (one of its ingredients changed) and may name the recipe itself
    speedrun_model = RECIPES["speedrun"]["model"]
    assert make_config("cpu", {"cpu": {"tta_views": 1}}, recipe="speedrun").tta_views == 1
    assert make_config("cpu", {"cpu": {"recipe": "speedrun"}}).model == speedrun_model
    # the rehearsal runs at smoke's sizes: smoke's entry, unless the overlay has one of its own
    assert make_config("rehearsal", sizes).epochs == 7
    assert make_config("rehearsal", {**sizes, "rehearsal": {"epochs": 3}}).epochs == 3
    # None in an overlay is dropped too: the profile's value stays
    assert make_config("cpu", {"cpu": {"epochs": None}}).epochs == PROFILES["cpu"]["epochs"]


def test_an_overlay_key_that_is_no_profile_is_refused():
    with pytest.raises(ConfigError, match=rf"^overlay key\(s\) 'cuda' are no profile; key an overlay by {', '.join(PROFILES)}$"):
        make_config("cpu", {"cuda": {"epochs": 1}})
    with pytest.raises(ConfigError, match="unknown"):
        make_config("cpu", {"cpu": {"epoch": 1}})  # an unknown field, refused as in params


# The values the fault-injection pass (issue 13) tried: each gave a traceback or was accepted silently.
OUT_OF_RANGE = [("lr", -1.0), ("label_smoothing", 2.0), ("seed", -1), ("image_size", 99999), ("lr", float("inf")),
                ("lr", float("nan")), ("weight_decay", -1.0), ("ema_decay", 2.0), ("random_erasing", 5.0),
                ("epochs", 0), ("lr", 0.0), ("momentum", 1.0), ("min_lr", 0.5), ("grad_clip_norm", float("inf")),
                ("mixup_alpha", -0.1), ("warmup_epochs", float("nan")), ("image_size", 7), ("prefetch_factor", 0),
                # issue 30: values that were accepted and then took the machine down or did nothing
                ("num_workers", 400), ("prefetch_factor", 1000), ("accumulation_steps", 100_000),
                ("max_steps", 10**8), ("epochs", 10**6), ("lr", 5e-324), ("batch_size", 10**6),
                ("weight_decay", 5.0), ("freeze_backbone_epochs", 10**6), ("warmup_epochs", 1e6),
                ("max_train_images", 10**12), ("mixup_alpha", 1e4), ("cutmix_alpha", 1e4),
                ("backbone_lr_scale", 1e4), ("grad_clip_norm", 1e9), ("output_dir", ""),
                # issue 27: the switches that choose and average weights
                ("early_stopping_patience", -1), ("early_stopping_patience", 10**6), ("swa_epochs", 1)]


@pytest.mark.parametrize("name,value", OUT_OF_RANGE)
def test_values_outside_their_range_are_refused_in_one_line(name, value):
    with pytest.raises(ConfigError) as error:
        make_config("smoke", **{name: value})
    message = str(error.value)
    assert message.startswith(f"{name} must be ") and f"got {value!r}" in message and "\n" not in message


@pytest.mark.parametrize("name,value", OUT_OF_RANGE)
def test_the_cli_refuses_values_outside_their_range_in_one_line(name, value, capsys):
    from course_lib import cli

    assert cli.main(["train", "--profile", "smoke", "-p", f"{name}={value}"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"workbook train: error: {name} must be "), captured.err


def test_the_edges_of_each_range_are_accepted():
    config = make_config("smoke", lr=1e-9, min_lr=1e-9, momentum=0.0, weight_decay=0.0, label_smoothing=0.0,
                         ema_decay=0.0, random_erasing=1.0, seed=0, image_size=8, epochs=1, max_steps=0,
                         max_train_images=0, mixup_alpha=0.0, grad_clip_norm=0.0)
    assert config.random_erasing == 1.0 and config.image_size == 8
    assert make_config("smoke", image_size=4096, ema_decay=0.9999).image_size == 4096


@pytest.mark.parametrize("profile", ["smoke", "cpu", "gpu"])
@pytest.mark.parametrize("recipe", ["", "speedrun", "speedrun2", "best"])
def test_every_profile_and_recipe_is_in_range(profile, recipe):
    assert isinstance(make_config(profile, recipe=recipe or None), Config)  # raises ConfigError when out of range


def test_every_upper_bound_is_accepted_at_its_edge():
    from course_lib.config import MIN_LR, UPPER_BOUNDS

    assert make_config("smoke", **UPPER_BOUNDS).num_workers == UPPER_BOUNDS["num_workers"]
    assert make_config("smoke", lr=MIN_LR, min_lr=0.0).lr == MIN_LR


def test_a_parameter_given_twice_is_refused_not_last_wins(capsys):
    from course_lib import cli

    with pytest.raises(ConfigError, match=r"^-p batch_size is given twice \(32, then '64'\); give each parameter once$"):
        parse_assignments(["batch_size=32", "batch_size=64"])
    assert cli.main(["train", "--profile", "smoke", "-p", "epochs=1", "-p", "epochs=2"]) == 2
    assert capsys.readouterr().err.strip() == ("workbook train: error: -p epochs is given twice (1, then '2'); "
                                               "give each parameter once")


@pytest.mark.parametrize("text", ["\u0663\u0662", "\uff13\uff12", "1\u0660"])  # Arabic-Indic, full-width, mixed
def test_non_ascii_digits_are_not_numbers(text):
    assert int(text) > 0  # what Python itself would accept
    for name in ("batch_size", "lr"):
        with pytest.raises(ConfigError, match=f"{name} must be (int|float), got"):
            parse_assignments([f"{name}={text}"])


def test_the_reference_profile_is_the_cpu_profiles_machine_and_tables_fall_back_to_cpu():
    """The long accuracy studies' profile: the cpu profile's settings; a chapter table without a reference entry
    gives cpu's (as rehearsal takes smoke's), one with its own gives that."""
    from course_lib.config import PROFILES, profile_entry

    assert make_config("reference") == make_config("cpu")
    assert PROFILES["reference"] == PROFILES["cpu"]
    table = {"smoke": 1, "cpu": 2, "gpu": 3}
    assert profile_entry(table, "reference") == 2 and profile_entry({**table, "reference": 5}, "reference") == 5
    assert profile_entry(table, "rehearsal") == 1 and profile_entry(table, "gpu") == 3
    assert make_config("reference", {"cpu": {"epochs": 7}}).epochs == 7
    assert make_config("reference", {"cpu": {"epochs": 7}, "reference": {"epochs": 60}}).epochs == 60
