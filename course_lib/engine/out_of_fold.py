"""Out-of-fold predicted probabilities: k models of one recipe, each trained (`engine.train.fit`) on all
folds of a training split but one and scoring the one it did not see (stratified k-fold), so every
image is judged by a model that could not memorise its label. Confident learning ranks the labels
from them (`analysis.label_issues`; `workbook scan --labels`, notebook 15).
"""
from __future__ import annotations

import tempfile

import numpy as np

from course_lib.config import Config, ConfigError

# Every fold model trains on the pre-decoded cache, and without a validation split: nothing is chosen by it.
FOLD_SETTINGS = dict(storage="cache", tta_views=1, validation_from="folder", save_best=False, early_stopping_patience=0)


class Relabelled:
    """Images `indices` of `dataset` with the labels `targets` (one per index): a subset whose labels
    may differ from the dataset's own (planted flips, a relabelled cleaning)."""

    def __init__(self, dataset, indices, targets):
        self.dataset, self.indices = dataset, [int(i) for i in indices]
        self.targets = [int(t) for t in targets]
        if len(self.targets) != len(self.indices):
            raise ValueError(f"{len(self.indices)} images need as many labels, got {len(self.targets)}")

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        return self.dataset[self.indices[index]][0], self.targets[index]


def out_of_fold_probabilities(config: Config, dataset, targets, num_classes: int, *, folds: int = 5,
                              device_stage=None, progress: bool = True) -> np.ndarray:
    """Softmax probabilities (images x classes) for every image of `dataset` labelled `targets`, each
    from the one of `folds` models (stratified k-fold, `config.seed`) that did not train on it. Each
    model trains with `config` (`engine.train.fit`, checkpoints in a temporary folder) on the other
    folds; `device_stage` is the bundle's (uint8 batches normalised on the device)."""
    from sklearn.model_selection import StratifiedKFold

    from course_lib.analysis.evaluation import predict
    from course_lib.data.datasets import DataBundle
    from course_lib.data.device_augment import DeviceStage
    from course_lib.engine import train
    from course_lib.instruments.progress import Progress

    targets = np.asarray(targets, dtype=np.int64)
    smallest = np.bincount(targets, minlength=num_classes).min()
    if folds < 2 or smallest < folds:
        raise ConfigError(f"{folds}-fold needs at least {max(folds, 2)} images of every class (the smallest has "
                          f"{smallest}) and folds >= 2; use fewer folds (--folds) or more images")
    stage = device_stage if device_stage is not None else DeviceStage()
    probabilities = np.zeros((len(targets), num_classes), dtype=np.float64)
    splitter = StratifiedKFold(folds, shuffle=True, random_state=config.seed)
    with tempfile.TemporaryDirectory(prefix="oof-") as folder, \
            Progress(folds, "out-of-fold models", unit="folds", enabled=progress) as bar:
        for fold, (rest, held) in enumerate(splitter.split(np.zeros(len(targets)), targets)):
            bundle = DataBundle(Relabelled(dataset, rest, targets[rest]), None, None,
                                [str(c) for c in range(num_classes)], "out-of-fold", device_stage=stage)
            fitted = train.fit(config.replace(output_dir=f"{folder}/fold{fold}", seed=config.seed + fold),
                               bundle=bundle, progress=False, verbose=False)
            _, held_probabilities = predict(fitted.model, Relabelled(dataset, held, targets[held]), config,
                                            device_stage=stage)
            probabilities[held] = held_probabilities
            bar.update()
    return probabilities


def scan_labels(config: Config, folds: int = 5, progress: bool = True):
    """(bundle, training labels, out-of-fold probabilities, flagged indices most doubtful first, the file
    of each training image) for the training split of `config`'s data, every fold model trained with
    `config` and `FOLD_SETTINGS`."""
    from course_lib.analysis.label_issues import rank_label_issues
    from course_lib.data import class_split, pipeline

    config = config.replace(**FOLD_SETTINGS)
    bundle = pipeline.build_datasets(config)
    targets = class_split.targets_of(bundle.train)
    probabilities = out_of_fold_probabilities(config, bundle.train, targets, bundle.num_classes, folds=folds,
                                              device_stage=bundle.device_stage, progress=progress)
    return (bundle, targets, probabilities, rank_label_issues(targets, probabilities),
            file_names(config, bundle.train, targets))


def file_names(config: Config, dataset, targets) -> list[str]:
    """The file of each image of a training split: its own reference (`evaluation.image_reference`) when
    it has one; for a pre-decoded cache, which keeps pixels but not names, the folder's files in
    ImageFolder order when the cache holds all of them (same count, same labels); else "index:N"."""
    from pathlib import Path

    from course_lib.analysis.evaluation import image_reference
    from course_lib.data.images import list_image_folder, split_folders

    references = [image_reference(dataset, index) for index in range(len(dataset))]
    if not config.data_dir or not any(reference.startswith("index:") for reference in references):
        return references
    root = Path(config.data_dir)
    _, samples = list_image_folder(split_folders(root).get("train", root))
    if len(samples) == len(targets) and all(label == int(target) for (_, label), target in zip(samples, targets)):
        return [path for path, _ in samples]
    return references
