"""Every command the README and docs/*.md show in a code block, and how a test runs it in the smoke profile.

One entry per command, in README order (then docs/*.md): `shown` is the command as the README prints it (without its
comment); `run` is what tests/test_readme_commands.py executes, in a scratch project, with `--profile
smoke` (or the smoke-sized form of the same command; the `best` recipe's wide net on 128 of the sample's images: its
two commands took 9 and 6 s so, 17 and 11 s on all 320, on a 2-core AMD EPYC); `last_line` is a regular expression for its last
printed line; `before` are commands that set the stage (a checkpoint to evaluate). A command that
cannot run in a test says why in `skip`. tests/test_readme_commands.py fails when the README gains,
loses or changes a command that this list does not.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReadmeCommand:
    shown: str
    run: str = ""
    last_line: str = ""
    skip: str = ""
    before: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = (0,)


CONTAINERS = "needs a container runtime, a registry and a GPU; tests/test_containers.py checks the files"
DOWNLOAD = ("fetches the real 90 MB archive (no network here); tests/test_download.py runs the same command "
            "end to end against a loopback server, --from included")
SPEEDRUN_SUMMARY = r"^\s*seconds in all\s"

COMMANDS = [
    # its run is also the first of `workbook compare RUN_A RUN_B` below (one smoke run of 00 fewer)
    ReadmeCommand("make workbook", "workbook run --profile smoke --only 00 --out runs/compare-a",
                  r"^index: .*index\.html$"),
    ReadmeCommand("make test", skip="the command that runs these tests"),
    ReadmeCommand("workbook data get eurosat", skip=DOWNLOAD),
    ReadmeCommand("workbook scan data_cache/eurosat --duplicates",
                  "workbook scan data_samples/landcover-synth --duplicates --no-progress", r"^hashed \d+ images: ",
                  exit_codes=(0, 1)),
    ReadmeCommand("workbook data get eurosat --from EuroSAT.zip", skip=DOWNLOAD),
    ReadmeCommand("workbook reference list", "workbook reference list", r"^(no reference results in |\d\d: )"),
    ReadmeCommand("workbook doctor", "workbook doctor", r"problem\(s\); doctor took", exit_codes=(0, 1)),
    ReadmeCommand("workbook doctor --json", "workbook doctor --json --no-measure", r"^}$", exit_codes=(0, 1)),
    ReadmeCommand("workbook doctor --data-dir PATH", "workbook doctor --data-dir data_samples/landcover-synth",
                  r"problem\(s\); doctor took", exit_codes=(0, 1)),
    ReadmeCommand("workbook doctor --no-measure", "workbook doctor --no-measure", r"problem\(s\); doctor took",
                  exit_codes=(0, 1)),
    ReadmeCommand("workbook bench decode --json", "workbook bench decode --json --profile smoke", r"^}$"),
    ReadmeCommand("workbook bench loader --workers 0,1,2,4 --json",
                  "workbook bench loader --workers 0,1,2,4 --json --profile smoke", r"^}$"),
    ReadmeCommand("workbook train --profile cpu -p model=resnet18 -p epochs=3 -p optimizer=adamw -p lr=1e-3",
                  "workbook train --profile smoke --no-progress -p model=resnet18 -p epochs=3 -p optimizer=adamw "
                  "-p lr=1e-3", r"^checkpoint: "),
    ReadmeCommand("workbook train --profile cpu -p model=resnet18 -p optimizer=adamw -p lr=1e-3 -p epochs=5 -p resume=true",
                  "workbook train --profile smoke --no-progress -p model=resnet18 -p optimizer=adamw -p lr=1e-3 -p epochs=5 "
                  "-p resume=true",
                  r"^checkpoint: "),
    ReadmeCommand("torchrun --standalone --nproc-per-node 2 -m course_lib train --profile gpu -p epochs=5",
                  "torchrun --standalone --nproc-per-node 2 -m course_lib train --profile smoke --no-progress "
                  "-p epochs=2 -p output_dir=runs/checkpoints/ddp", r"^checkpoint: "),
    ReadmeCommand("workbook train -p checkpoint=runs/checkpoints/source/last.pt -p optimizer=adamw -p lr=1e-3 "
                  "-p freeze_backbone_epochs=2 -p backbone_lr_scale=0.1",
                  "workbook train --profile smoke --no-progress -p checkpoint=runs/checkpoints/source/last.pt "
                  "-p optimizer=adamw -p lr=1e-3 -p freeze_backbone_epochs=2 -p backbone_lr_scale=0.1 -p epochs=3 "
                  "-p output_dir=runs/checkpoints/target", r"^checkpoint: ",
                  before=("workbook train --profile smoke --no-progress -p output_dir=runs/checkpoints/source",)),
    ReadmeCommand("workbook speedrun", "workbook speedrun --profile smoke --no-progress -p epochs=2",
                  SPEEDRUN_SUMMARY),
    ReadmeCommand("workbook speedrun --budget-seconds 300 -p tta_views=1",
                  "workbook speedrun --profile smoke --no-progress --budget-seconds 300 -p tta_views=1 -p epochs=2",
                  SPEEDRUN_SUMMARY),
    ReadmeCommand("workbook speedrun --seeds 5", "workbook speedrun --profile smoke --no-progress --seeds 2 "
                  "-p epochs=2", SPEEDRUN_SUMMARY),
    ReadmeCommand(".venv/bin/python benchmarks/bench_speedrun.py",
                  "python benchmarks/bench_speedrun.py --profile smoke --seeds 2 -p epochs=2 --out runs/bench",
                  r"^\| 1 \| "),
    ReadmeCommand(".venv/bin/python benchmarks/bench_speedrun.py --recipe best --seeds 3",
                  # One seed (the command above runs two), at 48 px: 11 s of CPU against 21 s at the recipe's 80 px
                  "python benchmarks/bench_speedrun.py --profile smoke --recipe best --seeds 1 -p epochs=2 "
                  "-p max_train_images=128 -p image_size=48 -p min_image_size=24 --out runs/bench",
                  r"^\| 0 \| "),
    ReadmeCommand(".venv/bin/python benchmarks/bench_speedrun.py --recipe best --seeds 1 --validation-from train "
                  "-p image_size=64 -p min_image_size=32 --out benchmarks/results/best-choice/64px-40-epochs",
                  "python benchmarks/bench_speedrun.py --profile smoke --recipe best --seeds 1 --validation-from train "
                  "-p image_size=64 -p min_image_size=32 -p epochs=2 -p max_train_images=128 "
                  "--out runs/bench/best-choice/64px-40-epochs",
                  r"^\| 0 \| "),
    ReadmeCommand("workbook data get imagenette", skip=DOWNLOAD),
    ReadmeCommand(".venv/bin/python benchmarks/bench_imagenette.py",
                  "python benchmarks/bench_imagenette.py --profile smoke --seeds 2 --out runs/bench", r"^\| 1 \| "),
    ReadmeCommand(".venv/bin/python benchmarks/bench_imagenette.py -p image_size=128",
                  "python benchmarks/bench_imagenette.py --profile smoke --seeds 2 -p image_size=128 --out runs/bench",
                  r"^\| 1 \| "),
    ReadmeCommand("workbook eval runs/checkpoints/last.pt --split val",
                  "workbook eval runs/checkpoints/last.pt --split val", r"^saved "),
    ReadmeCommand("workbook eval CHECKPOINT -p device=cpu -p batch_size=256 --json",
                  "workbook eval runs/checkpoints/last.pt -p device=cpu -p batch_size=256 --json",
                  r"^}$"),
    ReadmeCommand("workbook compare RUN_A RUN_B", "workbook compare runs/compare-a runs/compare-b", r"\S",
                  before=("workbook run --profile smoke --only 00 --out runs/compare-b",)),
    ReadmeCommand("workbook compare 09-baseline-cpu 09-mixup-cpu", "workbook compare a b", r"\S",
                  before=("workbook eval runs/checkpoints/a/last.pt --name a",
                          "workbook eval runs/checkpoints/b/last.pt --name b")),
    ReadmeCommand("workbook compare runs/evals/a.npz runs/evals/b.npz --json",
                  "workbook compare runs/evals/a.npz runs/evals/b.npz --json", r"^}$"),
    ReadmeCommand("workbook compare runs/checkpoints/a/last.pt runs/checkpoints/b/last.pt --split val",
                  "workbook compare runs/checkpoints/a/last.pt runs/checkpoints/b/last.pt --split val", r"\S"),
    ReadmeCommand("workbook train --profile cpu -p output_dir=runs/checkpoints/mine",
                  "workbook train --profile smoke --no-progress -p output_dir=runs/checkpoints/mine", r"^checkpoint: "),
    ReadmeCommand("workbook export runs/checkpoints/mine/last.pt --format onnx --int8",
                  "workbook export runs/checkpoints/mine/last.pt --format onnx --int8 --repeats 1", r"\S"),
    ReadmeCommand("workbook train --profile smoke -p monitor_interval=0.5 -p grad_norm_log=true -p tensorboard=true",
                  "workbook train --profile smoke --no-progress -p monitor_interval=0.5 -p grad_norm_log=true -p tensorboard=true",
                  r"^checkpoint: "),
    ReadmeCommand("docker build -t workbook .", skip=CONTAINERS),
    ReadmeCommand('docker run --gpus all --ipc=host -v "$PWD/runs:/workbook/runs" workbook', skip=CONTAINERS),
    ReadmeCommand('docker run --gpus all --ipc=host -v "$PWD/docs/results:/workbook/docs/results" workbook '
                  "scripts/gpu_check.sh", skip=CONTAINERS),
    ReadmeCommand("docker build -f Dockerfile.cpu -t workbook-cpu .", skip=CONTAINERS),
    ReadmeCommand('docker run --ipc=host -v "$PWD/runs:/workbook/runs" workbook-cpu', skip=CONTAINERS),
    ReadmeCommand("apptainer build workbook.sif containers/workbook.def", skip=CONTAINERS),
    ReadmeCommand('apptainer run --nv --bind "$PWD":/workbook workbook.sif', skip=CONTAINERS),
    # docs/your_own_data.md: my_dataset is the committed sample's folder here
    ReadmeCommand("workbook scan my_dataset", "workbook scan data_samples/landcover-synth",
                  r"^checked \d+ files: 0 problem\(s\)$"),
    ReadmeCommand("workbook scan my_dataset --duplicates",
                  "workbook scan data_samples/landcover-synth --duplicates --no-progress", r"^hashed \d+ images: ",
                  exit_codes=(0, 1)),
    ReadmeCommand("workbook train -p data_dir=my_dataset",
                  "workbook train --profile smoke --no-progress -p data_dir=data_samples/landcover-synth "
                  "-p output_dir=runs/checkpoints/own", r"^checkpoint: "),
    ReadmeCommand("workbook speedrun --recipe speedrun -p data_dir=my_dataset --seeds 5",
                  "workbook speedrun --profile smoke --no-progress --recipe speedrun "
                  "-p data_dir=data_samples/landcover-synth --seeds 2 -p epochs=2", SPEEDRUN_SUMMARY),
    ReadmeCommand("workbook advise --model resnet50 --batch-size 256 --image-size 224 --precision bf16",
                  "workbook advise --model resnet50 --batch-size 256 --image-size 224 --precision bf16",
                  r"^H200 SXM\s+141 GiB\s+yes\s"),
]

# Checkpoints the compare commands read: two short smoke trainings, made once before any command runs.
SETUP = ("workbook train --profile smoke --no-progress -p output_dir=runs/checkpoints/a",
         "workbook train --profile smoke --no-progress -p output_dir=runs/checkpoints/b -p seed=1")
