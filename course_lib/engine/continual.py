"""Continual (class-incremental) learning: a model trained on some classes learns new ones, and
three ways to do it are compared on the old and the new classes after each step:

- naive fine-tuning on the new classes' images only: the old classes are forgotten
  ("catastrophic forgetting", McCloskey and Cohen 1989; French 1999);
- rehearsal: the new images plus a small memory of old images, the same number per old class
  (experience replay; Rebuffi et al. 2017, iCaRL, arXiv:1611.07725, keep a class-balanced exemplar set),
  replayed in balance with the new classes: each old image is repeated so that every old class is
  seen as often per epoch as every new class (Chaudhry et al. 2019, "On Tiny Episodic Memories in
  Continual Learning", arXiv:1902.10486, mix memory and new data in every batch). Without that, a
  memory of 20 images per class against hundreds per new class weighs too little, and the old
  classes are forgotten almost as much as by naive fine-tuning;
- Learning without Forgetting (Li and Hoiem 2016, arXiv:1606.09282): new images only, with the
  old model's softened outputs on them as targets for the old classes (`engine.distillation`).

The old classes are the first labels (0 .. k-1), so a label means the same class at every step;
the model's head grows with `widen_head`, keeping the old classes' rows.
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch

from course_lib.config import ConfigError
from course_lib.engine.distillation import Distiller

STRATEGIES = ("naive", "rehearsal", "lwf")


class ClassSubset(torch.utils.data.Subset):
    """The images of a dataset at `indices`, with their `targets` (labels unchanged)."""

    def __init__(self, dataset, indices):
        super().__init__(dataset, list(indices))
        all_targets = dataset_targets(dataset)
        self.targets = [all_targets[i] for i in self.indices]
        self.classes = getattr(dataset, "classes", None)


def dataset_targets(dataset) -> list[int]:
    targets = getattr(dataset, "targets", None)
    if targets is None:
        raise ConfigError(f"{type(dataset).__name__} does not list its labels (.targets); continual learning "
                          "needs storage=files (an image folder)")
    return [int(t) for t in targets]


def images_of(dataset, classes) -> ClassSubset:
    """The images of `dataset` whose label is in `classes`."""
    wanted = set(classes)
    return ClassSubset(dataset, [i for i, t in enumerate(dataset_targets(dataset)) if t in wanted])


def rehearsal_memory(dataset, classes, per_class: int, seed: int = 0) -> list[int]:
    """Indices of `per_class` images of each class in `classes` (fewer when a class has fewer),
    drawn at random with `seed`: the class-balanced memory of old images."""
    if per_class < 1:
        raise ValueError(f"the rehearsal memory needs at least 1 image per class, got {per_class}")
    targets = np.asarray(dataset_targets(dataset))
    rng = np.random.default_rng(seed)
    chosen = []
    for label in classes:
        members = np.flatnonzero(targets == label)
        chosen += rng.choice(members, size=min(per_class, len(members)), replace=False).tolist()
    return sorted(chosen)


def replay_in_balance(memory: list[int], targets, images_per_class: int) -> list[int]:
    """The memory's indices repeated so that each of its classes appears about `images_per_class`
    times per epoch (the new classes' mean count): a class with m stored images is repeated
    round(images_per_class / m) times, at least once. The images stay the memory's; only how often
    the loss sees them changes."""
    targets = np.asarray(targets)
    counts = np.bincount(targets[memory]) if memory else np.zeros(0, dtype=int)
    replayed = []
    for index in memory:
        replayed += [index] * max(1, round(images_per_class / counts[targets[index]]))
    return sorted(replayed)


def widen_head(model: torch.nn.Module, num_classes: int) -> torch.nn.Module:
    """A copy of `model` whose classifier has `num_classes` outputs: the old rows (weights and
    biases) are kept, the new rows freshly initialised (timm's `reset_classifier`)."""
    old_head = model.get_classifier()
    wider = copy.deepcopy(model)
    wider.reset_classifier(num_classes)
    new_head = wider.get_classifier()
    if new_head.out_features < old_head.out_features:
        raise ValueError(f"the head can only grow: {old_head.out_features} -> {num_classes} classes")
    with torch.no_grad():
        new_head.weight[:old_head.out_features] = old_head.weight
        if old_head.bias is not None:
            new_head.bias[:old_head.out_features] = old_head.bias
    return wider


@dataclasses.dataclass
class ClassSplit:
    old: list[int]  # labels learned first (0 .. k-1)
    new: list[int]  # labels added in the second step

    @classmethod
    def first(cls, num_classes: int, old_classes: int) -> "ClassSplit":
        if not 1 <= old_classes < num_classes:
            raise ConfigError(f"old_classes must be between 1 and {num_classes - 1} (of {num_classes}), got {old_classes}")
        return cls(list(range(old_classes)), list(range(old_classes, num_classes)))


def task_bundle(bundle, split: ClassSplit, strategy: str | None = None, memory_per_class: int = 20, seed: int = 0,
                balanced: bool = True):
    """The DataBundle of one step: `strategy=None` is the first step (old classes only, an
    old-class head); otherwise the new classes' training images (plus, for "rehearsal", the memory
    of `memory_per_class` old images per class, replayed in balance with the new classes unless
    `balanced=False`), validated on every class."""
    from course_lib.data.datasets import DataBundle

    if strategy is None:
        return DataBundle(train=images_of(bundle.train, split.old), val=images_of(bundle.val, split.old), test=None,
                          classes=[bundle.classes[i] for i in split.old], source=f"{bundle.source}, old classes",
                          device_stage=bundle.device_stage, pipeline=bundle.pipeline)
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    train = images_of(bundle.train, split.new)
    if strategy == "rehearsal":
        memory = rehearsal_memory(bundle.train, split.old, memory_per_class, seed)
        if balanced:
            memory = replay_in_balance(memory, dataset_targets(bundle.train), len(train) / len(split.new))
        train = ClassSubset(bundle.train, sorted(train.indices + memory))
    return DataBundle(train=train, val=bundle.val, test=None, classes=list(bundle.classes),
                      source=f"{bundle.source}, new classes ({strategy})", device_stage=bundle.device_stage,
                      pipeline=bundle.pipeline)


def learn_new_classes(old_model: torch.nn.Module, config, bundle, split: ClassSplit, strategy: str, *,
                      memory_per_class: int = 20, temperature: float = 2.0, distillation_weight: float = 0.5,
                      balanced: bool = True, **fit_options):
    """The second step: `old_model` (trained on `split.old`) with a widened head trained by `strategy`
    on the new classes. Returns the engine's FitResult."""
    from course_lib.engine import train

    step_bundle = task_bundle(bundle, split, strategy, memory_per_class, config.seed, balanced)
    teacher = (Distiller(copy.deepcopy(old_model), temperature, distillation_weight) if strategy == "lwf" else None)
    return train.fit(config, bundle=step_bundle, model=widen_head(old_model, len(bundle.classes)), teacher=teacher,
                     **fit_options)


def accuracy_by_group(model: torch.nn.Module, dataset, config, groups: dict[str, list[int]], device_stage=None) -> dict:
    """Top-1 accuracy of `model` on the images of each group of labels ({"old": [...], "new": [...]}),
    and on all of them; a group with no images (or labels the model lacks) scores 0."""
    from course_lib.analysis.evaluation import predict

    labels, probabilities = predict(model, dataset, config, device_stage=device_stage)
    predicted = probabilities.argmax(axis=1)
    scores = {"all": float((predicted == labels).mean())}
    for name, members in groups.items():
        mask = np.isin(labels, members)
        scores[name] = float((predicted[mask] == labels[mask]).mean()) if mask.any() else 0.0
    return scores
