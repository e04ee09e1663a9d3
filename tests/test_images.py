"""Image basics (`data.images`): 16-bit images scaled to 8 bits."""
import numpy as np
from PIL import Image

from course_lib.data import images


def test_a_16_bit_png_loads_scaled_to_8_bits_not_clipped_white(tmp_path):
    path = tmp_path / "depth.png"
    values = np.array([[0, 257, 32896, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(path)
    assert np.asarray(images.load_rgb(path))[0, :, :].tolist() == [[0] * 3, [1] * 3, [128] * 3, [255] * 3]
    gradient = np.linspace(0, 65535, 64 * 64).astype(np.uint16).reshape(64, 64)
    Image.fromarray(gradient).save(path)
    loaded = np.asarray(images.load_rgb(path)).astype(int)
    assert (loaded == 255).mean() < 0.01  # PIL's convert("RGB") makes over 99% of them white
    assert np.abs(loaded[..., 0] - np.round(gradient / 257)).max() == 0
