"""The shape every chapter's setup shares (issue 45): a notebook starts from `<chapter>.setup(profile, ...)`,
which returns a `ChapterSetup`: the resolved profile, the data the run found, the chapter's base config, the
datasets built once from it and the hardware line, with the device the config trains on and one `line()` to
print under the data line. Each chapter's class adds its own sizes and choices as fields. Making one prints
the notebook's expected time in its profile (`analysis.expected_time`), which then names every long cell
before it runs."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from course_lib import devices, machine
from course_lib.analysis import expected_time
from course_lib.config import Config, ConfigError, profile_entry, resolve_profile


@dataclasses.dataclass(kw_only=True)
class ChapterSetup:
    """What every chapter's setup holds. Keyword-only, so a chapter's own fields come first in its class."""

    profile: str  # resolved: smoke | cpu | gpu (rehearsal runs smoke's sizes with gpu's switches)
    data: object = None  # paths.DataChoice: what the notebook prints first (None: the chapter reads no dataset)
    config: Config | None = None  # the chapter's base configuration
    bundle: object = None  # the DataBundle built once from `config` (None: the chapter builds none here)
    hardware: str = ""  # machine.describe_hardware(); read when not given
    # The notebook's first setup says its expected time; a section's second setup (06's scaling) does not.
    announces_time: ClassVar[bool] = True

    def __post_init__(self):
        self.hardware = self.hardware or machine.describe_hardware()
        if self.announces_time:  # the notebook's expected time in this profile, and a line before each long cell
            expected_time.announce(self.profile)

    @property
    def device(self):
        """The torch.device `config` trains on (a ConfigError when it names a GPU that is not here)."""
        return devices.resolve_device(self.config.device if self.config is not None else "cpu")

    def line(self) -> str:
        """The profile, the model and its images, the datasets' sizes and the hardware (printed under the data line)."""
        parts = [f"profile {self.profile}"]
        if self.config is not None:
            parts.append(f"{self.config.model} at {self.config.image_size} px")
        if self.bundle is not None:
            validation = len(self.bundle.val) if self.bundle.val is not None else 0
            parts.append(f"{len(self.bundle.train)} training and {validation} validation images")
        return "; ".join(parts) + f"; machine: {self.hardware}"


def sizes(table: dict, profile: str) -> dict:
    """A chapter's per-profile sizes and choices, `table[profile]` (auto: resolved; rehearsal: smoke's): the one
    way a chapter reads its `SIZES`, so that no chapter branches on the profile inline (tests/test_layout.py)."""
    entry = profile_entry(table, resolve_profile(profile))
    if entry is None:
        raise ConfigError(f"this chapter has no sizes for profile {profile!r}; it has {', '.join(table)}")
    return entry
