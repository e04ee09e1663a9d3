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
