"""The container runtime's GPU failure modes (`measure.container_runtime`, notebook 11 section 11): each made-up
broken machine gets its own cause and only that one, a healthy machine none, and this machine's facts are read
without starting anything."""
import pytest

from course_lib.measure import container_runtime as runtime

HEALTHY = {
    "a host with docker and the toolkit": {**runtime.BROKEN_MACHINES["no NVIDIA Container Toolkit on the host"],
                                           "toolkit": True},
    "a container with the GPU passed in": {**runtime.BROKEN_MACHINES["started without --gpus"],
                                           "nvidia_devices": ["/dev/nvidia0"], "visible_devices": "all"},
    "WSL2 with the Windows driver": {**runtime.BROKEN_MACHINES["WSL2 without the Windows driver's GPU bridge"],
                                     "dxg": True, "wsl_libcuda": True},
}


def test_each_broken_machine_is_given_its_own_cause_and_no_other():
    assert runtime.diagnoses_each_broken_machine() == {name: [name] for name in runtime.FAILURE_MODES}


@pytest.mark.parametrize("name", list(HEALTHY))
def test_a_healthy_machine_is_given_no_cause(name):
    rows = runtime.diagnose(HEALTHY[name])
    assert [row["failure"] for row in rows] == list(runtime.FAILURE_MODES)
    assert all(row["verdict"] != runtime.CAUSE for row in rows), rows


def test_inside_a_container_the_hosts_toolkit_cannot_be_told_and_the_row_says_where_to_check():
    rows = {row["failure"]: row for row in runtime.diagnose(runtime.BROKEN_MACHINES["started without --gpus"])}
    toolkit = rows["no NVIDIA Container Toolkit on the host"]
    assert toolkit["verdict"] == runtime.NOT_HERE and "check there" in toolkit["here"]
    assert "NVIDIA_VISIBLE_DEVICES unset" in rows["started without --gpus"]["here"]
    assert "--gpus all" in rows["started without --gpus"]["fix"]


def test_this_machines_facts_are_read_without_starting_anything():
    facts = runtime.runtime_facts()
    assert set(facts) == set(runtime.BROKEN_MACHINES["started without --gpus"])
    assert all(isinstance(facts[key], bool) for key in facts if key not in ("nvidia_devices", "visible_devices"))
    assert len(runtime.diagnose(facts)) == len(runtime.FAILURE_MODES)
