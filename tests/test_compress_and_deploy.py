"""Notebook 13's chapter: claims and ISA tables."""
from course_lib.chapters import compress_and_deploy as study
from course_lib.measure.inventory import cpu_isa


def test_cpu_isa_reads_the_flags():
    flags = cpu_isa("processor: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert flags["avx512_vnni"] and flags["avx2"] and not flags["amx_int8"]
    assert not any(cpu_isa("").values())


def _tables(distilled_top1=(0.80, 0.82, 0.81), channel_ms=20.0, rehearsal_forgetting=5.0, channel_top1=0.89):
    import pandas as pd

    distillation = [{"method": method, "seed": seed, "val top-1": top1, "images/s@64": 3000.0}
                    for seed in range(3) for method, top1 in (("labels only", 0.78 + 0.01 * seed),
                                                              ("distilled (T=4, weight 0.9)", distilled_top1[seed]))]
    pruned = [{"method": "dense (teacher)", "requested": 0.0, "val top-1": 0.9, "ms@64": 100.0, "zero weights": 0.0,
               "images/s@64": 640.0},
              {"method": "unstructured L1", "requested": 0.9, "val top-1": 0.85, "ms@64": 100.0, "zero weights": 0.9},
              {"method": "channels L1", "requested": 0.5, "val top-1": channel_top1, "ms@64": channel_ms,
               "zero weights": 0.0}]
    quantized = pd.DataFrame([{"precision": "fp32 (eager)", "val top-1": 0.9, "ms@64": 100.0},
                              {"precision": "int8 PT2E reference (not compiled)", "val top-1": 0.89, "ms@64": 130.0}]
                             ).set_index("precision")
    served = pd.DataFrame([{"served as": "PyTorch eager fp32", "val top-1": 0.9, "ms@64": 100.0, "max |logit diff|": 0.0},
                           {"served as": "onnxruntime fp32", "val top-1": 0.9, "ms@64": 90.0, "max |logit diff|": 1e-7},
                           {"served as": "onnxruntime int8 (static QDQ)", "val top-1": 0.9, "ms@64": 30.0,
                            "max |logit diff|": 0.1}]).set_index("served as")
    continual = [{"strategy": "step 1: old classes only", "old classes": 0.9, "new classes": 0.0},
                 {"strategy": "step 2: naive", "old classes": 0.1, "new classes": 0.9},
                 {"strategy": "step 2: rehearsal", "old classes": 0.9 - rehearsal_forgetting / 100, "new classes": 0.8},
                 {"strategy": "step 2: lwf", "old classes": 0.85 - rehearsal_forgetting / 100, "new classes": 0.8}]
    for row in continual:
        row["forgetting (old, points)"] = 100 * (0.9 - row["old classes"])
    return distillation, pruned, quantized, served, continual


def test_claims_decide_the_five_claims(monkeypatch):
    from course_lib.analysis import claims

    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    found = study.claims(*_tables())
    assert [c.key for c in found] == ["deploy_distillation", "deploy_pruning", "deploy_quantization", "deploy_export",
                                      "continual_learning"]
    assert all(c.verdict == claims.HOLDS for c in found), [c.reason for c in found]
    assert "onnxruntime int8" in found[2].reason and "rehearsal" in found[4].reason
    # A distilled student worse on every seed, no faster channel pruning, a cure that forgets as much as naive.
    failing = study.claims(*_tables(distilled_top1=(0.70, 0.71, 0.69), channel_ms=99.0,
                                          rehearsal_forgetting=80.0))
    assert failing[0].verdict == failing[1].verdict == claims.REFUTED
    assert failing[4].verdict == claims.REFUTED and failing[2].verdict == claims.HOLDS


def test_pruning_and_distillation_must_hold_on_accuracy_and_speed_together(monkeypatch):
    """Issue 51: half-channel pruning at 44.9% read "holds" on speed alone; a student 3.6 points below the labels-only
    one read "holds" too."""
    from course_lib.analysis import claims

    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    found = study.claims(*_tables(channel_top1=0.45, distilled_top1=(0.75, 0.75, 0.77)))
    assert found[1].verdict == claims.REFUTED and "5.0x" not in found[1].reason  # 5x faster, 45 points lost
    assert found[0].verdict == claims.REFUTED  # -4 [-5.2, -2.8] points: below the 1-point margin
    assert "rule: holds wholly above -2 points" in found[1].reason
    slow = study.claims(*_tables(channel_ms=99.0))
    assert slow[1].verdict == claims.REFUTED  # top-1 kept, but no faster


def test_one_student_per_method_decides_nothing_but_a_missed_speed(monkeypatch):
    """The cpu pass trains one student per method: a single pair is a point, not an interval, so the accuracy half
    of deploy_distillation is not shown (the reference profile's five seeds decide); a student no faster than its
    teacher still refutes it."""
    from course_lib.analysis import claims

    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    distillation, *rest = _tables(distilled_top1=(0.95, 0.95, 0.95))  # 17 points above labels alone
    one_seed = [row for row in distillation if row["seed"] == 0]
    import pandas as pd

    found = study.claims(pd.DataFrame(one_seed).to_dict("records"), *rest)
    assert found[0].verdict == claims.NOT_SHOWN and "one seed gives no interval" in found[0].reason
    slow = [dict(row, **{"images/s@64": 600.0}) for row in one_seed]
    assert study.claims(slow, *rest)[0].verdict == claims.REFUTED
