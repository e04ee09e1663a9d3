"""The shape every chapter's setup shares (issue 45): a notebook starts from `<chapter>.setup(profile, ...)`,
which returns a `ChapterSetup`: the resolved profile, the data the run found, the chapter's base config, the
datasets built once from it and the hardware line, with the device the config trains on and one `line()` to
print under the data line. Each chapter's class adds its own sizes and choices as fields."""
from __future__ import annotations

import dataclasses

from course_lib.config import Config


@dataclasses.dataclass(kw_only=True)
class ChapterSetup:
    """What every chapter's setup holds. Keyword-only, so a chapter's own fields come first in its class."""

    profile: str  # resolved: smoke | cpu | gpu (rehearsal runs smoke's sizes with gpu's switches)
    data: object = None  # paths.DataChoice: what the notebook prints first (None: the chapter reads no dataset)
    config: Config | None = None  # the chapter's base configuration
    bundle: object = None  # the DataBundle built once from `config` (None: the chapter builds none here)
    hardware: str = ""  # ledger.describe_hardware(); read when not given

    def __post_init__(self):
        if not self.hardware:
            from course_lib import ledger

            self.hardware = ledger.describe_hardware()

    @property
    def device(self):
        """The torch.device `config` trains on (a ConfigError when it names a GPU that is not here)."""
        from course_lib import devices

        return devices.resolve_device(self.config.device if self.config is not None else "cpu")

    def line(self) -> str:
        """What the notebook prints under the data line: the profile, the model and its images, the datasets'
        sizes and the hardware. A chapter with more to say overrides it."""
        parts = [f"profile {self.profile}"]
        if self.config is not None:
            parts.append(f"{self.config.model} at {self.config.image_size} px")
        if self.bundle is not None:
            validation = len(self.bundle.val) if self.bundle.val is not None else 0
            parts.append(f"{len(self.bundle.train)} training and {validation} validation images")
        return "; ".join(parts) + f"; machine: {self.hardware}"


def sizes(table: dict, profile: str) -> dict:
    """A chapter's per-profile sizes and choices, `table[profile]` (rehearsal: smoke's, which it runs at): the one
    way a chapter reads its `SIZES`, so that no chapter branches on the profile inline (tests/test_layout.py)."""
    from course_lib.config import ConfigError, profile_entry

    entry = profile_entry(table, profile)
    if entry is None:
        raise ConfigError(f"this chapter has no sizes for profile {profile!r}; it has {', '.join(table)}")
    return entry
