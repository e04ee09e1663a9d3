"""Out-of-fold probabilities (`engine.out_of_fold`): relabelled subsets, k models that each score the
images they did not train on, and `workbook scan --labels` end to end."""
import contextlib
import io

import numpy as np
import pytest
from conftest import ROOT, TensorImages, tiny_config

from course_lib import cli
from course_lib.analysis import label_issues
from course_lib.config import ConfigError
from course_lib.engine import out_of_fold


def test_relabelled_serves_its_own_labels():
    data = TensorImages(6, 3, 8)
    subset = out_of_fold.Relabelled(data, [4, 1], [2, 2])
    assert len(subset) == 2 and subset[0][1] == 2 and subset.targets == [2, 2]
    assert (subset[0][0] == data[4][0]).all()
    with pytest.raises(ValueError, match="2 images need as many labels"):
        out_of_fold.Relabelled(data, [4, 1], [0])


@pytest.mark.slow
def test_out_of_fold_probabilities_come_from_models_that_did_not_see_the_image(tmp_path):
    data = TensorImages(120, 3, 16)  # the class sets the image's mean: learnable
    targets = np.asarray(data.targets)
    noisy, flipped = label_issues.plant_flips(targets, 0.1, 3, seed=1)
    config = tiny_config(tmp_path, epochs=4, batch_size=16, lr=0.05)
    probabilities = out_of_fold.out_of_fold_probabilities(config, data, noisy, 3, folds=3, progress=False)
    assert probabilities.shape == (120, 3) and np.allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    # Each image was scored by a model trained without it, so its planted label is not memorised.
    assert (probabilities.argmax(axis=1) == targets).mean() > 0.8
    score = label_issues.score_finder(label_issues.rank_label_issues(noisy, probabilities), flipped)
    assert score.recall >= 0.7, score.line()
    with pytest.raises(ConfigError, match="needs at least 5 images of every class"):
        out_of_fold.out_of_fold_probabilities(config, TensorImages(9, 3, 16), np.arange(9) % 3, 3, folds=5)


@pytest.mark.slow
def test_scan_labels_from_the_command_line():
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        status = cli.main(["scan", str(ROOT / "data_samples" / "landcover-synth"), "--labels", "--folds", "2",
                           "--profile", "smoke", "-p", "epochs=2", "-p", "image_size=32", "--top", "3", "--no-progress"])
    lines = output.getvalue().splitlines()
    assert lines[0].startswith("labels: 2 speedrun_resnet_small models (2 epochs each)")
    assert "training labels flagged by confident learning" in lines[-1]
    suspects = [line for line in lines if line.startswith("suspect: ")]
    assert len(suspects) <= 3 and all(".jpg" in line for line in suspects)
    assert status == (1 if suspects else 0)
