import json

import pytest

from course_lib import ledger
from course_lib.cli import main
from course_lib.data import decode
from course_lib.measure import bench

SAMPLE = "data_samples/landcover-synth/train"
CPU_DECODERS = ["pil", "opencv", "torchvision"]


def test_bench_decode_json_records_a_ledger_row(capsys):
    code = main(["bench", "decode", "--profile", "smoke", "--json", "--sizes", "32", "--images", "4",
                 "--repeats", "1", "--decoders", "pil,opencv", "--folder", SAMPLE])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert {r["decoder"] for r in result["rows"]} == {"pil", "opencv"} and len(result["rows"]) == 4
    row = ledger.Ledger().rows(kind="bench", name="decode")[0]
    assert row["metrics"]["opencv_32px_images_per_second"] > 0


def test_bench_loader_reports_the_knee(capsys):
    code = main(["bench", "loader", "--profile", "smoke", "--workers", "0", "--images", "16", "--epochs", "1",
                 "--folder", SAMPLE])
    assert code == 0
    out = capsys.readouterr().out
    assert "knee_setting: workers=0" in out and "hardware:" in out
    metrics = ledger.Ledger().rows(kind="bench", name="loader")[0]["metrics"]
    assert metrics["usable_cores"] >= 1 and metrics["fraction_of_cores_times_single_rate"] > 0


def test_new_benchmarks_plug_in_through_register(capsys, monkeypatch):
    monkeypatch.setattr(bench, "BENCHMARKS", dict(bench.BENCHMARKS))
    bench.register("echo", "test", lambda parser: parser.add_argument("--n", type=int, default=2),
                   lambda args, config: bench.BenchResult([{"n": args.n}], {"n": args.n}, {}))
    assert main(["bench", "echo", "--n", "5", "--json", "--no-record"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"] == {"n": 5}


def test_bad_worker_list_is_a_one_line_error(capsys):
    assert main(["bench", "loader", "--workers", "a,b", "--folder", SAMPLE]) == 2
    assert "comma-separated integers" in capsys.readouterr().err


def test_benchmark_reports_every_decoder_on_the_same_inputs():
    rows = bench.benchmark_decoders([decode.jpeg_samples(64, 1)[0]] * 4, CPU_DECODERS, repeats=1, warmup=0, label="x")
    assert [r["decoder"] for r in rows] == CPU_DECODERS
    for row in rows:
        assert row["images"] == 4 and row["image_size"] == 64
        assert row["images_per_second"] > 0
        assert row["megabytes_per_second"] == pytest.approx(row["megabytes"] / row["seconds_median"])
        assert row["images_per_second_repeats"] == [pytest.approx(row["images_per_second"])]  # one per repeat
    assert rows[0]["speedup_vs_pil"] == 1.0
