"""The chapter behind notebook 04: claims from small fake tables."""
import pandas as pd
import pytest

from course_lib.analysis import claims
from course_lib.chapters import gradient_accumulation


def tables(bn_difference=0.2, accumulated_mib=3.6, slow=True):
    gradients = pd.DataFrame([
        {"model": "nfnet", "BatchNorm": False, "micro-batches": 2, "max relative difference": 1e-7, "without the 1/N": 1.0},
        {"model": "nfnet", "BatchNorm": False, "micro-batches": 4, "max relative difference": 2e-7, "without the 1/N": 3.0},
        {"model": "resnet", "BatchNorm": True, "micro-batches": 2, "max relative difference": bn_difference,
         "without the 1/N": 2.0},
    ])
    engine = pd.DataFrame([
        {"model": "nfnet", "accumulation_steps": 1, "max weight difference vs steps=1": 0.0, "images/s": 100.0, "MFU": 0.1},
        {"model": "nfnet", "accumulation_steps": 2, "max weight difference vs steps=1": 1e-7, "images/s": 90.0, "MFU": 0.09},
        {"model": "resnet", "accumulation_steps": 1, "max weight difference vs steps=1": 0.0, "images/s": 200.0, "MFU": 0.2},
        {"model": "resnet", "accumulation_steps": 4, "max weight difference vs steps=1": 0.1,
         "images/s": 120.0 if slow else 210.0, "MFU": 0.12},
    ])
    memory = pd.DataFrame([{"effective batch": 4, "bigger batch MiB": 2.6, "accumulated MiB": 2.6},
                           {"effective batch": 16, "bigger batch MiB": 5.4, "accumulated MiB": accumulated_mib}])
    return gradients, engine, memory


@pytest.fixture(autouse=True)
def fake_hardware(monkeypatch):
    monkeypatch.setattr(claims, "_hardware", lambda: "fake machine")


def test_claims_hold_on_the_expected_measurements():
    found = {c.key: c for c in gradient_accumulation.claims(*tables(), max_steps=3)}
    assert list(found) == ["accumulation_equals_big_batch", "forgetting_one_over_n", "batchnorm_caveat",
                           "accumulation_memory", "accumulation_cost"]
    assert all(c.verdict == claims.HOLDS for c in found.values())
    assert found["accumulation_cost"].measured == pytest.approx(0.6)
    assert "MFU 12.0%" in found["accumulation_cost"].reason


def test_claims_fail_when_the_measurements_say_so():
    found = {c.key: c for c in gradient_accumulation.claims(*tables(bn_difference=1e-6, accumulated_mib=6.0,
                                                                         slow=False), max_steps=3)}
    for key in ("batchnorm_caveat", "accumulation_memory", "accumulation_cost"):
        assert found[key].verdict == claims.REFUTED


def test_engine_table_computes_mfu_per_model():
    import timm

    models = {"test_resnet": timm.create_model("test_resnet", num_classes=4)}
    table = gradient_accumulation.engine_table([{"model": "test_resnet", "images/s": 10.0}], models, 32, "cpu")
    assert list(table.columns) == ["model", "images/s", "MFU"] and table["MFU"].iloc[0] > 0
