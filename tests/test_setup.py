"""chapters.setup.sizes: the one way a chapter reads its per-profile SIZES."""
import pytest
import torch

from course_lib.chapters.setup import sizes
from course_lib.config import ConfigError

TABLE = {"smoke": {"epochs": 1}, "cpu": {"epochs": 3}, "gpu": {"epochs": 20}}


@pytest.mark.parametrize("cuda, expected", [(False, 3), (True, 20)])
def test_auto_reads_the_profile_it_resolves_to(monkeypatch, cuda, expected):
    """A notebook's default profile="auto" reached augmentation_strength.study unresolved and was refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert sizes(TABLE, "auto")["epochs"] == expected


def test_rehearsal_runs_at_smokes_sizes_and_a_missing_profile_is_one_line():
    assert sizes(TABLE, "rehearsal") == {"epochs": 1}
    with pytest.raises(ConfigError, match="no sizes for profile 'gpu'; it has smoke, cpu"):
        sizes({"smoke": {}, "cpu": {}}, "gpu")
    with pytest.raises(ConfigError, match="unknown profile 'laptop'"):
        sizes(TABLE, "laptop")
