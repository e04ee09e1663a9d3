"""The eight symmetries of the square and small translations, per batch."""
import pytest
import torch

from course_lib.data import overhead_augment as oa


def asymmetric(count: int = 1, side: int = 6) -> torch.Tensor:
    """Images with no symmetry at all: every pixel a different value."""
    return torch.arange(count * 3 * side * side, dtype=torch.float32).view(count, 3, side, side)


def test_eight_views_are_distinct_permutations_of_the_pixels():
    image = asymmetric()
    views = oa.dihedral_views(image)
    assert len(views) == 8
    for view in views:
        assert torch.equal(view.flatten().sort().values, image.flatten().sort().values)  # same pixels
    flat = torch.stack([v.flatten() for v in views])
    assert len(torch.unique(flat, dim=0)) == 8  # all different
    assert torch.equal(views[0], image)


def test_views_form_the_dihedral_group():
    image = asymmetric()
    # Four quarter turns give the identity; a mirror twice gives the identity.
    assert torch.equal(oa.dihedral(oa.dihedral(oa.dihedral(oa.dihedral(image, 1), 1), 1), 1), image)
    assert torch.equal(oa.dihedral(oa.dihedral(image, 4), 4), image)
    assert torch.equal(oa.dihedral(image, 1), torch.rot90(image, 1, dims=(-2, -1)))
    assert torch.equal(oa.dihedral_views(image, 2)[1], image.flip(-1))


def test_batch_dihedral_maps_each_image_to_one_of_its_views():
    images = asymmetric(32)
    out = oa.batch_dihedral(images, torch.Generator().manual_seed(0))
    chosen = []
    for i in range(len(images)):
        matches = [v for v in range(8) if torch.equal(out[i], oa.dihedral(images[i:i + 1], v)[0])]
        assert len(matches) == 1
        chosen.append(matches[0])
    assert len(set(chosen)) > 4  # the draws differ between images


def test_translate_shifts_by_at_most_max_shift_and_keeps_shape():
    images = asymmetric(16, side=8)
    out = oa.batch_translate(images, 2, torch.Generator().manual_seed(1))
    assert out.shape == images.shape
    assert torch.equal(oa.batch_translate(images, 0), images)
    padded = torch.nn.functional.pad(images, (2,) * 4, mode="reflect")
    for i in range(len(images)):  # each output is one 8x8 window of its padded image
        windows = [(dy, dx) for dy in range(5) for dx in range(5)
                   if torch.equal(out[i], padded[i, :, dy:dy + 8, dx:dx + 8])]
        assert windows


@pytest.mark.parametrize("view", [-1, 8])
def test_bad_view_is_refused(view):
    with pytest.raises(ValueError, match="0..7"):
        oa.dihedral(asymmetric(), view)
