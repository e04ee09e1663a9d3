"""Issue 48: the whitened stem (airbench's whitening layer, `models/whitening.py`), checked against the closed
form: the filters are the patch covariance's eigenvectors scaled by 1/sqrt(eigenvalue + eps), so the stem's
outputs over the patches have covariance diag(eigenvalue / (eigenvalue + eps)), the identity up to eps."""
import pytest
import timm
import torch
import torch.nn.functional as F

from course_lib.config import ConfigError, make_config
from course_lib.models import whitening


def _correlated_images(count=64, size=16, seed=0):
    """Images whose pixels are correlated across neighbours and channels (a blurred, channel-mixed noise),
    so the patch covariance is far from a multiple of the identity."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(count, 3, size + 2, size + 2, generator=generator)
    blurred = F.avg_pool2d(noise, 3, stride=1)  # neighbours share pixels
    mixing = torch.tensor([[1.0, 0.5, 0.2], [0.3, 1.0, 0.4], [0.1, 0.6, 1.0]])
    return torch.einsum("dc,nchw->ndhw", mixing, blurred)


def test_the_filters_are_the_scaled_eigenvectors_of_the_patch_covariance():
    images = _correlated_images()
    vectors = F.unfold(images.double(), 2).transpose(1, 2).reshape(-1, 12)
    covariance = vectors.T @ vectors / len(vectors)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
    filters = whitening.patch_whitening_weights(images, 2, eps=1e-3)
    assert filters.shape == (24, 3, 2, 2)
    flat = filters.reshape(24, 12)
    assert torch.allclose(flat[12:], -flat[:12])  # each eigenvector as +v and -v
    unscaled = flat[:12] * torch.sqrt(eigenvalues.flip(0) + 1e-3)[:, None]  # by decreasing eigenvalue
    # Orthonormal eigenvectors (up to sign): each one's |dot product| with eigh's is 1.
    assert (unscaled @ unscaled.T).numpy() == pytest.approx(torch.eye(12).numpy(), abs=1e-9)
    assert (unscaled @ eigenvectors.flip(1)).abs().diagonal().numpy() == pytest.approx([1.0] * 12, abs=1e-9)


@pytest.mark.parametrize("eps", [5e-4, 1e-2])
def test_the_stems_outputs_over_the_patches_have_identity_covariance_up_to_eps(eps):
    images = _correlated_images()
    filters = whitening.patch_whitening_weights(images, 2, eps=eps)
    outputs = F.conv2d(images.double(), filters[:12])  # stride 1: every patch
    flat = outputs.permute(0, 2, 3, 1).reshape(-1, 12)
    eigenvalues = torch.linalg.eigvalsh(whitening.patch_covariance(images, (2, 2))).flip(0)
    expected = torch.diag(eigenvalues / (eigenvalues + eps))
    assert (flat.T @ flat / len(flat)).numpy() == pytest.approx(expected.numpy(), abs=1e-8)
    # The smallest eigenvalue here is about 2e-3, so eps = 5e-4 still shows; images 10x brighter (eigenvalues
    # 100x larger) are whitened to the identity within eps / 0.2 = 0.25%.
    bright = 10 * images
    outputs = F.conv2d(bright.double(), whitening.patch_whitening_weights(bright, 2, eps=eps)[:12])
    flat = outputs.permute(0, 2, 3, 1).reshape(-1, 12)
    assert (flat.T @ flat / len(flat)).numpy() == pytest.approx(torch.eye(12).numpy(), abs=100 * eps / 0.2)


def test_batches_give_the_covariance_of_all_their_images():
    images = _correlated_images(count=10)
    whole, parts = (timm.create_model("speedrun_resnet_tiny", num_classes=3) for _ in range(2))
    whitening.whiten_first_conv(whole, images)
    done = whitening.whiten_first_conv(parts, [images[:4], images[4:]])
    assert done == {"layer": "stem.0", "filters": 8, "images": 10}
    assert torch.allclose(whole.stem[0].weight, parts.stem[0].weight, atol=1e-6)


@pytest.mark.parametrize("model_name, stem_width", [("speedrun_resnet_tiny", 8), ("speedrun_resnet_small", 16),
                                                    ("speedrun_resnet", 32)])
def test_a_stem_of_any_width_takes_the_strongest_directions_first_and_is_frozen(model_name, stem_width):
    images = _correlated_images(count=16)
    model = timm.create_model(model_name, num_classes=3)
    before = model.stem[0].weight.detach().clone()
    whitening.whiten_first_conv(model, images)
    weight = model.stem[0].weight
    filters = whitening.patch_whitening_weights(images, 2).float()
    used = min(stem_width, 24)  # 8 and 16 filters: a prefix of +v (and -v); 32: 24 whitened, 8 as initialised
    assert torch.allclose(weight[:used], filters[:used], atol=1e-5)
    assert torch.equal(weight[used:], before[used:])
    assert not weight.requires_grad


def test_a_model_without_a_plain_first_conv_is_refused_in_one_line():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(ConfigError, match="whiten_stem needs a model whose first layer is a plain Conv2d") as error:
        whitening.whiten_first_conv(model, _correlated_images(count=2))
    assert "\n" not in str(error.value)


def test_whiten_stem_refuses_weights_it_would_overwrite():
    for start in (dict(pretrained=True), dict(checkpoint="runs/x/last.pt")):
        with pytest.raises(ConfigError, match="whiten_stem must be false with pretrained or checkpoint weights"):
            make_config("smoke", whiten_stem=True, **start)


def test_a_new_field_at_its_old_behaviour_keeps_the_digest_of_models_already_trained():
    from course_lib.models import checkpoint

    config = make_config("smoke")
    new = ("whiten_stem", "activation", "tta_selective")
    before = {key: value for key, value in config.to_dict().items() if key not in new}  # a Config of before
    assert checkpoint.config_digest(config.to_dict()) == checkpoint.config_digest(before)
    for change in (dict(whiten_stem=True), dict(tta_selective=0.25)):
        assert checkpoint.config_digest(config.replace(**change).to_dict()) != checkpoint.config_digest(before)


def test_off_by_default_nothing_is_whitened_or_frozen(capsys):
    from course_lib.engine import train

    config = make_config("smoke", model="speedrun_resnet_tiny", max_steps=1)
    assert config.whiten_stem is False
    state = train.prepare(config, verbose=True)
    stem = state.raw_model.stem[0].weight
    assert stem.requires_grad and "whiten_stem" not in capsys.readouterr().out
    assert any(p is stem for group in state.optimizer.param_groups for p in group["params"])


def test_one_fit_on_the_smoke_profile_with_the_candidates_on(capsys, tmp_path):
    """whiten_stem, activation=relu and selective TTA together on the speed-run tiny net: it trains, the stem
    keeps its whitened filters (frozen, out of the optimizer), and the TTA columns are there."""
    from course_lib.engine import train

    config = make_config("smoke", model="speedrun_resnet_tiny", whiten_stem=True, activation="relu", tta_views=2,
                         tta_selective=0.5, max_steps=1, epochs=1, output_dir=str(tmp_path))
    state = train.prepare(config, verbose=True)
    whitened = state.raw_model.stem[0].weight.detach().clone()
    assert "whiten_stem: 8 filters of stem.0 from the patches of" in capsys.readouterr().out
    assert not any(p is state.raw_model.stem[0].weight for group in state.optimizer.param_groups
                   for p in group["params"])
    result = train.fit(config, verbose=False, progress=False)
    assert torch.equal(result.model.stem[0].weight.detach().cpu(), whitened.cpu())
    assert isinstance(result.model.stem[2], torch.nn.ReLU)
    assert 0 <= result.history[-1]["val_tta_top1"] <= 1


def test_a_resident_split_is_whitened_from_the_device_tensor(capsys):
    from course_lib.engine import train

    config = make_config("smoke", model="speedrun_resnet_tiny", whiten_stem=True, storage="device",
                         augmentation="device", max_steps=1)
    state = train.prepare(config, verbose=True)
    assert f"from the patches of {min(len(state.bundle.train), train.WHITENING_IMAGES)} training images" in \
        capsys.readouterr().out
    assert not state.raw_model.stem[0].weight.requires_grad
