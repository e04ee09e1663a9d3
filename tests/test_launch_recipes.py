"""The cluster launch recipes in docs/ (SLURM, SkyPilot, Kubeflow Trainer) start the project's one
entry point the way `engine.torchrun.torchrun_command` does: their torchrun arguments parse with torch's own
parser, carry the rendezvous flags the code uses, and end in `-m course_lib train` with flags the
workbook CLI accepts."""
import re
import shlex
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from torch.distributed.run import get_args_parser

from course_lib import cli
from course_lib.config import parse_assignments
from course_lib.engine import torchrun

# What the code launches: the flags torchrun_command passes, and the train command's own flags.
CODE_COMMAND = torchrun.torchrun_command("train", torchrun.command_args("train", {}, "gpu", []), 4, nnodes=2,
                                         rdzv_endpoint="head:29500", rdzv_id="run", log_dir=Path("logs"))
CODE_TORCHRUN = get_args_parser().parse_args(CODE_COMMAND[CODE_COMMAND.index("torch.distributed.run") + 1:])
# Flags that only make sense on one machine (the loopback address, console prefixes) or are optional.
LOCAL_ONLY = {"--local-addr", "--log-line-prefix-template", "--tee", "--log-dir"}
TORCHRUN_PART = CODE_COMMAND[CODE_COMMAND.index("torch.distributed.run") + 1:CODE_COMMAND.index("course_lib") - 1]
RENDEZVOUS_FLAGS = {token for token in TORCHRUN_PART if token.startswith("--")} - LOCAL_ONLY


def shell_command(script: str) -> list[str]:
    """The tokens after `torch.distributed.run` in a shell script (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    line = next(line for line in joined.splitlines() if "torch.distributed.run" in line)
    tokens = shlex.split(line, comments=True)
    return [t for t in tokens[tokens.index("torch.distributed.run") + 1:] if t != "$@"]


def substitute(tokens: list[str], values: dict) -> list[str]:
    return [re.sub(r"\$\{?(\w+)\}?", lambda m: str(values.get(m.group(1), m.group(0))), t) for t in tokens]


def slurm():
    return shell_command((ROOT / "docs" / "slurm_example.sh").read_text())


def skypilot():
    recipe = yaml.safe_load((ROOT / "docs" / "skypilot.yaml").read_text())
    return substitute(shell_command(recipe["run"]), recipe.get("envs", {}))


def kubeflow():
    command = yaml.safe_load((ROOT / "docs" / "kubeflow_trainjob.yaml").read_text())["spec"]["trainer"]["command"]
    return command[command.index("torch.distributed.run") + 1:]


RECIPES = {"slurm": slurm, "skypilot": skypilot, "kubeflow": kubeflow}


@pytest.mark.parametrize("name", RECIPES)
def test_the_recipe_runs_the_projects_entry_point_with_flags_the_cli_accepts(name):
    tokens = RECIPES[name]()
    parsed = get_args_parser().parse_args(tokens)  # torch's own torchrun parser
    assert parsed.module and parsed.training_script == "course_lib"
    assert parsed.max_restarts == CODE_TORCHRUN.max_restarts
    arguments = cli.build_parser().parse_args(parsed.training_script_args)
    assert arguments.command == "train"
    code_train_args = CODE_COMMAND[CODE_COMMAND.index("course_lib") + 1:]
    assert parsed.training_script_args[:len(code_train_args)] == code_train_args  # train --profile gpu --no-progress
    parse_assignments(arguments.param)  # every -p is a Config field of the right type


@pytest.mark.parametrize("name", ["slurm", "skypilot"])
def test_shell_recipes_use_the_codes_c10d_rendezvous(name):
    tokens = RECIPES[name]()
    assert RENDEZVOUS_FLAGS <= set(tokens), f"missing {RENDEZVOUS_FLAGS - set(tokens)}"
    parsed = get_args_parser().parse_args(tokens)
    assert parsed.rdzv_backend == CODE_TORCHRUN.rdzv_backend == "c10d"


def test_skypilot_takes_nodes_ips_and_rank_from_its_environment():
    recipe = yaml.safe_load((ROOT / "docs" / "skypilot.yaml").read_text())
    assert recipe["num_nodes"] >= 2 and recipe["resources"]["accelerators"]
    for variable in ("SKYPILOT_NODE_IPS", "SKYPILOT_NODE_RANK", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert variable in recipe["run"]
    tokens = shell_command(recipe["run"])
    assert tokens[tokens.index("--nnodes") + 1] == "$SKYPILOT_NUM_NODES"
    assert "${HEAD_IP}" in tokens[tokens.index("--rdzv-endpoint") + 1]


def test_kubeflow_trainjob_is_the_v2_api_with_the_torch_runtime():
    job = yaml.safe_load((ROOT / "docs" / "kubeflow_trainjob.yaml").read_text())
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] >= 2 and trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] >= 1
    # The runtime sets the rendezvous through torchrun's PET_* environment: the command must not
    # contradict it with flags of its own, only use flags the code uses.
    flags = {token for token in kubeflow() if token.startswith("--") and token in RENDEZVOUS_FLAGS | LOCAL_ONLY}
    assert flags <= {"--max-restarts"}


def test_slurm_takes_the_head_node_from_the_job():
    script = (ROOT / "docs" / "slurm_example.sh").read_text()
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    tokens = slurm()
    assert tokens[tokens.index("--rdzv-endpoint") + 1] == "${HEAD_NODE}:${RDZV_PORT}"


def test_the_notebooks_mapping_names_what_each_recipe_holds():
    for flag, values in torchrun.CLUSTER_EQUIVALENTS.items():
        for recipe, value in zip(torchrun.CLUSTER_RECIPES, values):
            if not value.startswith("("):  # "(the node's own IP)": set by torchrun itself there
                needle = value.split(" (")[0].split(":")[0]
                assert needle in (ROOT / recipe).read_text() or needle.startswith("the TrainJob"), (flag, recipe, needle)
    table = torchrun.cluster_mapping(CODE_COMMAND)
    assert table.loc["--nnodes", "loopback (this machine)"] == "2"
    assert table.loc["entry point", "SLURM"] == "-m course_lib train"
