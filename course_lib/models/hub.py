"""Pretrained weights on the Hugging Face hub: which repository holds a timm model's weights, whether
they are in the local cache, whether the hub can be reached, and a one-line error that says what
to do when neither holds (timm: https://huggingface.co/docs/timm).
"""
from __future__ import annotations

import socket
from urllib.parse import urlparse

from course_lib.config import ConfigError


class PretrainedWeightsError(ConfigError):
    """timm's pretrained weights cannot be loaded here; the message names the ways to get them."""


def weights_repository(model_name: str) -> str | None:
    """The Hugging Face hub repository timm loads `model_name`'s default weights from, or None."""
    from timm.models import get_pretrained_cfg

    return getattr(get_pretrained_cfg(model_name), "hf_hub_id", None) or None


def weights_cached(model_name: str) -> bool:
    """Whether the Hugging Face cache (HF_HOME) already holds the weights timm would load."""
    from huggingface_hub import try_to_load_from_cache

    repository = weights_repository(model_name)
    return repository is not None and any(isinstance(try_to_load_from_cache(repository, name), str)
                                          for name in ("model.safetensors", "pytorch_model.bin"))


def hub_reachable(timeout_seconds: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (HF_HUB_OFFLINE=1 counts as no)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    endpoint = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_seconds):
            return True
    except OSError:
        return False


def pretrained_available(model_name: str) -> bool:
    """timm has weights for `model_name` and they are cached or downloadable right now."""
    return weights_repository(model_name) is not None and (weights_cached(model_name) or hub_reachable())


def _unavailable(model_name: str, detail: str) -> PretrainedWeightsError:
    return PretrainedWeightsError(
        f"pretrained weights for {model_name} are not available ({detail}); be online once so timm can "
        "download them into the Hugging Face cache, or set HF_HUB_OFFLINE=1 with a cache (HF_HOME) that "
        "holds them, or start from a workbook checkpoint with checkpoint=<path> pretrained=false")
