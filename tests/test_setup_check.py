from course_lib.chapters import setup_check


def test_package_report_covers_runtime_requirements():
    rows = {row["package"]: row for row in setup_check.package_report()}
    assert {"torch", "timm", "papermill"} <= set(rows)
    assert "pytest" not in rows  # a dev extra
    assert rows["torch"]["ok"] and rows["torch"]["installed"]


def test_advice_names_missing_packages_and_cpu_builds():
    packages = [{"package": "seaborn", "required": ">=0.13", "installed": None, "ok": False}]
    facts = {"built_with_cuda": None, "cuda_available": False, "device_names": []}
    advice = setup_check.install_advice(packages, facts)
    assert "pip install 'seaborn>=0.13'" in advice[0]
    assert "CPU-only build" in advice[1]
    ok = setup_check.install_advice([], {"built_with_cuda": "12.4", "cuda_available": True, "device_names": ["H200"]})
    assert ok == ["nothing to install: every package fits and torch sees H200"]


def test_matmul_check_cpu_row():
    rows = setup_check.matmul_check(64)
    assert rows[0]["device"] == "cpu" and rows[0]["gflops"] > 0 and rows[0]["agrees"]


def test_claims_without_a_gpu_are_not_measurable(monkeypatch):
    from course_lib.analysis import claims

    monkeypatch.setattr(claims, "_hardware", lambda: "fake machine")
    facts = {"torch": "2.5.1+cpu", "built_with_cuda": None, "cuda_available": False, "device_count": 0, "device_names": []}
    rows = [{"device": "cpu", "gflops": 50.0, "max_abs_diff_vs_cpu": 0.0, "agrees": True}]
    found = {c.key: c for c in setup_check.claims(facts, rows, 512)}
    assert list(found) == ["cuda_available", "cpu_gpu_same_matmul", "gpu_much_faster", "wheel_ships_cuda_runtime"]
    assert all(c.verdict == claims.NOT_MEASURABLE for c in found.values())


def test_claims_with_a_gpu_compare_it_with_the_cpu(monkeypatch):
    from course_lib.analysis import claims

    monkeypatch.setattr(claims, "_hardware", lambda: "fake gpu")
    facts = {"torch": "2.5.1", "built_with_cuda": "12.4", "cuda_available": True, "device_count": 1, "device_names": ["H200"]}
    rows = [{"device": "cpu", "gflops": 50.0, "max_abs_diff_vs_cpu": 0.0, "agrees": True},
            {"device": "cuda:0 (H200)", "gflops": 40000.0, "max_abs_diff_vs_cpu": 1e-4, "agrees": True}]
    found = {c.key: c for c in setup_check.claims(facts, rows, 2048)}
    assert all(c.verdict == claims.HOLDS for key, c in found.items() if key != "wheel_ships_cuda_runtime")
    assert found["wheel_ships_cuda_runtime"].verdict == claims.DEMONSTRATED  # a property of the wheel: shown
    assert found["gpu_much_faster"].measured == 800.0


def test_setup_builds_the_chosen_data_with_the_given_sizes(monkeypatch):
    from course_lib import machine

    monkeypatch.setattr(machine, "describe_hardware", lambda: "fake machine")
    setup = setup_check.setup("smoke", image_size=48, dataset=None)
    assert setup.config.image_size == 48 and setup.profile == "smoke" and setup.data.synthetic
    assert setup.line() == f"profile smoke: {setup.config.dataset} at 48 px on {setup.config.device}; machine: fake machine"
    sizes = setup.split_sizes()
    assert sizes["train"] == len(setup.bundle.train) > 0 and sizes["val"] == len(setup.bundle.val)
    assert set(sizes) == {"train", "val", "test"}
