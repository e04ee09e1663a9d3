"""Whether torch and torchvision import together, asked of a child process: a broken install (a torchvision
built for another torch: "operator torchvision::nms does not exist", or a torch whose libraries are
missing) becomes one line naming the pair and the fix, not a traceback. `workbook` (every command, `doctor`
included) asks it when an import fails; `make venv` runs `python -m course_lib.measure.install_check` after
installing. This module imports neither library itself.
"""
from __future__ import annotations

import subprocess
import sys
from importlib import metadata

PAIR_CHECK = "import torch, torchvision"
CHECK_SECONDS = 300  # a cold import of torch on a slow disk takes tens of seconds
# torchvision 0.N is built for torch 2.(N - 15): 0.15 for 2.0, 0.29 for 2.14 (pytorch.org's previous-versions page)
TORCHVISION_MINOR_OFFSET = 15


def installed_version(distribution: str) -> str | None:
    """The installed version of `distribution` as pip recorded it, without importing it; None when absent."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def matching_torchvision(torch_version: str | None) -> str | None:
    """The torchvision release line built for `torch_version` ("2.14.1" -> "0.29.*"), or None."""
    try:
        major, minor = (int(part) for part in (torch_version or "").split("+")[0].split(".")[:2])
    except ValueError:
        return None
    return f"0.{minor + TORCHVISION_MINOR_OFFSET}.*" if major == 2 else None


def torch_pair_problem(python: str = sys.executable) -> str | None:
    """None when `python` imports torch and torchvision together, else one line: the installed versions,
    the import's last error line, and how to install a matching pair."""
    try:
        done = subprocess.run([python, "-c", PAIR_CHECK], capture_output=True, text=True, timeout=CHECK_SECONDS)
    except subprocess.TimeoutExpired:
        return f"importing torch and torchvision took over {CHECK_SECONDS} s; check the disk the environment is on"
    if done.returncode == 0:
        return None
    last = next((line.strip() for line in reversed(done.stderr.splitlines()) if line.strip()), "no message")
    torch_version, vision_version = installed_version("torch"), installed_version("torchvision")
    pair = matching_torchvision(torch_version)
    mismatched = pair and vision_version and not vision_version.startswith(pair.rstrip("*"))
    fix = f"pip install 'torchvision=={pair}' (the line built for torch {torch_version}), or " if mismatched else ""
    return (f"torch {torch_version or 'not installed'} and torchvision {vision_version or 'not installed'} do not "
            f"import together ({last}); {fix}rebuild the environment: make clean-venv && make venv "
            "(TORCH=cpu for the CPU-only wheels)")


def main() -> int:
    problem = torch_pair_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
