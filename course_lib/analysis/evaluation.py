"""Evaluating a trained model on a split: `Evaluation` holds labels, probabilities and image
references (saved as .npz + JSON under runs/evals/, a ledger row of kind "eval"); `evaluate`
runs a checkpoint without any training code; `suggest_actions` turns the confusions into next steps.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from course_lib.analysis.calibration import expected_calibration_error
from course_lib.analysis.confusion import confusion_counts, most_confused_pairs
from course_lib.analysis.metrics import _check_scores, per_class_table, top_k_accuracy
from course_lib.config import ConfigError, WorkbookError
from course_lib.data.build_lock import DISK_FULL, disk_full
from course_lib.devices import resolve_device
from course_lib.paths import check_writable, project_root

if TYPE_CHECKING:  # pandas is imported where it is used, to keep imports light
    import pandas as pd

EVALS_DIR = Path("runs") / "evals"


class DamagedEvaluationError(WorkbookError, ValueError):
    """A saved evaluation that cannot be read whole; the message names the file and the fix."""


@dataclasses.dataclass
class Evaluation:
    """Predictions of one model on one split. `image_refs[i]` is a file path, or "index:<n>" (the
    image's index in the split's underlying array dataset, rendered from the rebuilt dataset)."""

    name: str
    classes: list
    labels: np.ndarray  # N true class indices
    probabilities: np.ndarray  # N x C softmax outputs
    image_refs: list
    metadata: dict = dataclasses.field(default_factory=dict)  # checkpoint, split, config ...
    path: Path | None = None  # the .npz it was saved to
    image_loader: object = None  # optional callable(index) -> image; overrides image_refs

    def __post_init__(self):
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.probabilities = np.asarray(self.probabilities, dtype=np.float32)
        self.classes = [str(c) for c in self.classes]
        self.image_refs = [str(r) for r in self.image_refs]
        _check_scores(self.probabilities, self.labels)
        if self.probabilities.shape[1] != len(self.classes):
            raise ValueError(f"{self.probabilities.shape[1]} probability columns but {len(self.classes)} classes")
        if len(self.image_refs) != len(self.labels):
            raise ValueError(f"{len(self.image_refs)} image references for {len(self.labels)} images")
        self._dataset_cache = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def predictions(self) -> np.ndarray:
        return self.probabilities.argmax(axis=1)

    @property
    def confidences(self) -> np.ndarray:
        """Top probability per image."""
        return self.probabilities.max(axis=1)

    def image_table(self, chosen) -> "pd.DataFrame":
        """The images at indices `chosen`: reference, true and predicted class, confidence and p(true), as the
        galleries list them."""
        import pandas as pd

        chosen, names = np.asarray(chosen, dtype=int), np.array(self.classes, dtype=object)
        return pd.DataFrame({"index": chosen, "image": [self.image_refs[i] for i in chosen],
                             "true": names[self.labels[chosen]], "predicted": names[self.predictions[chosen]],
                             "confidence": self.confidences[chosen].astype(float),
                             "true_class_probability": self.probabilities[chosen, self.labels[chosen]].astype(float)})

    def counts(self) -> np.ndarray:
        return confusion_counts(self.labels, self.predictions, self.num_classes)

    def per_class(self) -> "pd.DataFrame":
        return per_class_table(self.labels, self.predictions, self.classes)

    def summary(self, bins: int = 15) -> dict:
        """Headline numbers: top-1, top-5 (k capped at the class count), macro/weighted F1, ECE."""
        table = self.per_class()
        macro = table.loc["macro avg"]
        return {"images": int(len(self.labels)), "classes": self.num_classes,
                "top1": top_k_accuracy(self.probabilities, self.labels, 1),
                "top5": top_k_accuracy(self.probabilities, self.labels, 5), "top5_k": min(5, self.num_classes),
                "macro_precision": float(macro["precision"]), "macro_recall": float(macro["recall"]),
                "macro_f1": float(macro["f1"]), "weighted_f1": float(table.loc["weighted avg", "f1"]),
                "ece": expected_calibration_error(self.probabilities, self.labels, bins),
                "mean_confidence": float(self.confidences.mean()) if len(self.labels) else float("nan")}

    def load_image(self, index: int):
        """The image `index` refers to, as a PIL image (for galleries)."""
        if self.image_loader is not None:
            return _as_pil(self.image_loader(index))
        ref = self.image_refs[index]
        if ref.startswith("index:"):
            return _as_pil(_raw_image(self._base_dataset(), int(ref.split(":", 1)[1])))
        from course_lib.data.images import load_rgb

        return load_rgb(ref)

    def _base_dataset(self):
        """The split's underlying dataset, rebuilt from the stored config (array datasets only)."""
        if self._dataset_cache is None:
            config_values = self.metadata.get("config")
            if not config_values:
                raise FileNotFoundError(f"evaluation {self.name!r} stores image indices but no config to rebuild "
                                        "the dataset from; pass image_loader=")
            from course_lib.config import FIELD_NAMES, make_config
            from course_lib.data.pipeline import build_datasets

            known = {k: v for k, v in config_values.items() if k in FIELD_NAMES}
            bundle = build_datasets(make_config(None, **known))
            self._dataset_cache = _unwrap(getattr(bundle, self.metadata.get("split", "val")), 0)[0]
        return self._dataset_cache

    def save(self, folder: str | Path | None = None) -> Path:
        """Write <folder>/<name>.npz (labels, probabilities, image_refs) and <name>.json (classes,
        metadata, summary). Default folder: <project>/runs/evals."""
        folder = Path(folder) if folder else _evals_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.npz"
        sidecar = {"name": self.name, "classes": self.classes, "metadata": self.metadata,
                   "summary": self.summary()}
        # Both files through temporaries renamed into place, the sidecar last: a full disk leaves neither an
        # .npz without its .json nor an empty .json (issue 49, point 13).
        temporaries = [path.with_name(f".{path.name}.{os.getpid()}.tmp"),
                       path.with_name(f".{path.stem}.json.{os.getpid()}.tmp")]
        try:
            with open(temporaries[0], "wb") as handle:
                np.savez_compressed(handle, labels=self.labels, probabilities=self.probabilities,
                                    image_refs=np.array(self.image_refs, dtype=str))
            temporaries[1].write_text(json.dumps(sidecar, indent=2, default=str))
            os.replace(temporaries[0], path)
            os.replace(temporaries[1], path.with_suffix(".json"))
        except OSError as error:
            if error.errno not in DISK_FULL:
                raise
            raise disk_full(path, self.probabilities.nbytes, f"the evaluation {path.name}",
                            "free some space, or pass --out a folder on another disk") from None
        finally:
            for temporary in temporaries:
                temporary.unlink(missing_ok=True)
        self.path = path
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Evaluation":
        """The evaluation saved at `path` (.npz and .json sidecar); one that cannot be read whole (half an .npz, a
        sidecar without classes, a label that is no class) is one DamagedEvaluationError line (issue 49, point 13)."""
        import zipfile

        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(".npz")
        if not path.exists():
            raise FileNotFoundError(f"no evaluation at {path}; run `workbook eval CHECKPOINT` first")
        try:
            sidecar = json.loads(path.with_suffix(".json").read_text())
            with np.load(path, allow_pickle=False) as arrays:
                return cls(sidecar["name"], sidecar["classes"], arrays["labels"], arrays["probabilities"],
                           arrays["image_refs"].tolist(), sidecar.get("metadata", {}), path)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
            reason = f"no {error.args[0]!r} in it" if isinstance(error, KeyError) else (
                str(error).splitlines()[0] if str(error) else type(error).__name__)
            raise DamagedEvaluationError(f"evaluation {path} cannot be read ({reason[:160]}); run `workbook eval` "
                                         "again to write it afresh") from None


def _evals_dir() -> Path:
    return project_root() / EVALS_DIR


def list_evaluations(folder: str | Path | None = None) -> "pd.DataFrame":
    """Saved evaluations (newest first) with their headline numbers, from the JSON sidecars."""
    import pandas as pd

    folder = Path(folder) if folder else _evals_dir()
    rows = []
    for sidecar in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        data = json.loads(sidecar.read_text())
        summary = data.get("summary", {})
        rows.append({"name": data["name"], "path": str(sidecar.with_suffix(".npz")),
                     "split": data.get("metadata", {}).get("split"), "images": summary.get("images"),
                     "top1": summary.get("top1"), "macro_f1": summary.get("macro_f1"), "ece": summary.get("ece")})
    return pd.DataFrame(rows, columns=["name", "path", "split", "images", "top1", "macro_f1", "ece"])


def _as_pil(image):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    array = np.asarray(image)
    # Channels first (a tensor, a pre-decoded cache's uint8 rows) to channels last.
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.dtype != np.uint8:  # float in [0, 1]
        array = (np.clip(array, 0, 1) * 255).astype(np.uint8)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    return Image.fromarray(array).convert("RGB")


def _unwrap(dataset, index: int):
    """Follow subsets (`.dataset`/`.indices`) down to the dataset that holds the images."""
    while hasattr(dataset, "dataset") and hasattr(dataset, "indices"):
        index = int(dataset.indices[index])
        dataset = dataset.dataset
    return dataset, index


def image_reference(dataset, index: int) -> str:
    """A file path for image `index` of a (possibly nested) subset of an ImageFolder-like dataset,
    or "index:<n>" into the underlying array dataset (digits, CIFAR-10)."""
    base, base_index = _unwrap(dataset, index)
    samples = getattr(base, "samples", None) or getattr(base, "imgs", None)
    if samples is not None:
        return str(samples[base_index][0])
    return f"index:{base_index}"


def image_of(dataset, index: int):
    """Image `index` of a (possibly nested) subset as a PIL image, for galleries: its file when it has
    one (`image_reference`), else the pixels the underlying dataset holds."""
    reference = image_reference(dataset, index)
    if reference.startswith("index:"):
        return _as_pil(_raw_image(*_unwrap(dataset, index)))
    from course_lib.data.images import load_rgb

    return load_rgb(reference)


def _raw_image(base, index: int):
    for attribute in ("images", "data"):  # ArrayImageDataset, torchvision CIFAR
        array = getattr(base, attribute, None)
        if isinstance(array, np.ndarray):
            return array[index]
    image = base[index][0]
    if hasattr(image, "numpy"):  # a normalised tensor: undo Normalize for display
        from course_lib.data.transforms import denormalize

        image = denormalize(image).numpy()
    return image


PREDICT_BAR_DELAY_SECONDS = 5.0  # `predict` shows a bar (or plain lines) only once it has run this long


def predict(model, dataset, config, *, device_stage=None, views: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(labels, softmax probabilities) of `model` over `dataset`, in order, in fp32 (a small share of the time, and
    reduced precision would blur the calibration). `device_stage` (a bundle's) moves and normalises uint8 batches
    on the device; `views` > 1 averages over that many symmetries of the square (`overhead_augment.dihedral_views`)."""
    import torch

    from course_lib.data.loaders import make_loader
    from course_lib.data.overhead_augment import DIHEDRAL_VIEWS, dihedral_views
    from course_lib.instruments.progress import track

    if not 1 <= views <= DIHEDRAL_VIEWS:
        raise ValueError(f"test-time augmentation views must be 1..{DIHEDRAL_VIEWS}, got {views}")
    device = resolve_device(config.device)
    model = model.to(device).eval()
    memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
    loader = make_loader(dataset, config, train=False, drop_last=False)
    all_labels, all_probabilities = [], []
    with torch.inference_mode():
        # A bar only when the split takes more than a few seconds (a large split, 8 views on a CPU).
        batches = track(loader, "predicting", unit="batches", leave=False, delay=PREDICT_BAR_DELAY_SECONDS)
        for images, labels in batches:
            images = device_stage(images, device, train=False) if device_stage else images.to(device, non_blocking=True)
            probabilities = sum(torch.softmax(model(view.contiguous(memory_format=memory_format)).float(), dim=1)
                                for view in dihedral_views(images, views)) / views
            all_probabilities.append(probabilities.cpu().numpy())
            all_labels.append(np.asarray(labels))
    if not all_labels:
        raise ValueError("the split is empty: nothing to evaluate")
    return np.concatenate(all_labels), np.concatenate(all_probabilities)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "eval"


def evaluate_model(model, config, split: str = "val", classes=None, name: str | None = None,
                   metadata: dict | None = None, out_dir: str | Path | None = None, bundle=None,
                   record: bool = True, tta_views: int = 1) -> Evaluation:
    """Run `model` on `split` of `config`'s dataset (or `bundle`'s), save the evaluation and record an "eval" ledger
    row; `tta_views` > 1 averages over that many symmetries of the square (`predict`)."""
    from course_lib.data.datasets import SPLITS
    from course_lib.data.pipeline import build_datasets

    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {', '.join(SPLITS)}")
    started = time.perf_counter()
    bundle = bundle or build_datasets(config)
    dataset = getattr(bundle, split)
    if dataset is None:
        raise FileNotFoundError(f"the dataset has no {split} split ({bundle.source}); use split=val")
    if classes is not None and list(classes) != list(bundle.classes):
        raise ConfigError(f"the model was trained on classes {list(classes)} but {bundle.source} has "
                          f"{list(bundle.classes)}; evaluate on the dataset it was trained on (drop -p dataset= "
                          "or pass -p data_dir=<its folder>)")
    labels, probabilities = predict(model, dataset, config, device_stage=bundle.device_stage, views=tta_views)
    refs = [image_reference(dataset, i) for i in range(len(dataset))]
    name = _slug(name or f"{config.model}-{split}-{time.strftime('%Y%m%d-%H%M%S')}")
    metadata = {"split": split, "config": config.to_dict(), "source": bundle.source, "tta_views": tta_views,
                **(metadata or {})}
    evaluation = Evaluation(name, list(bundle.classes), labels, probabilities, refs, metadata)
    evaluation.save(out_dir)
    seconds = time.perf_counter() - started
    if record:
        from course_lib import ledger

        summary = evaluation.summary()
        ledger.record("eval", name, duration_seconds=seconds,
                      parameters={**config.to_dict(), "split": split, "checkpoint": metadata.get("checkpoint"),
                                  "weights": metadata.get("weights"), "tta_views": tta_views,
                                  "path": str(evaluation.path)},
                      metrics={k: v for k, v in summary.items() if isinstance(v, (int, float))})
    return evaluation


def evaluate(checkpoint_path: str | Path, split: str = "val", name: str | None = None,
             out_dir: str | Path | None = None, weights: str = "model", tta_views: int | None = None,
             **overrides) -> Evaluation:
    """Evaluate a checkpoint on `split` with its model and dataset rebuilt from its config plus `overrides` (e.g.
    device="cpu"), its EMA copy with `weights="ema"`; `tta_views` default: the views its config names."""
    from course_lib.data.overhead_augment import DIHEDRAL_VIEWS
    from course_lib.models import factory

    if weights not in ("model", "ema"):
        raise ConfigError(f"weights={weights!r} is not one of model, ema")
    if tta_views is not None and not 1 <= tta_views <= DIHEDRAL_VIEWS:
        raise ConfigError(f"--tta {tta_views} is not a number of views: give 1 (off) to {DIHEDRAL_VIEWS} "
                          "(2: the mirror, 8: every rotation and mirror)")
    path = Path(checkpoint_path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist; train one with `workbook train`")
    check_writable(Path(out_dir).absolute() if out_dir else _evals_dir(), "--out another folder")  # before the work
    saved = factory.load_trained(path, map_location="cpu")
    # The weights come from this checkpoint, not from a start checkpoint or timm's hub.
    config = factory.checkpoint_config(saved, path, **overrides)
    classes = list(saved["classes"])
    state = saved.get("ema") if weights == "ema" else saved["model"]
    if state is None:
        raise ConfigError(f"{path} has no EMA weights (trained with ema_decay=0); use weights=model")
    model = factory.build_model(config, len(classes))
    factory.load_weights(model, state, path, config.model)
    name = name or f"{path.parent.name}-{path.stem}-{weights}-{split}-{time.strftime('%Y%m%d-%H%M%S')}"
    return evaluate_model(model, config, split, classes=classes, name=name,
                          metadata={"checkpoint": str(path), "weights": weights}, out_dir=out_dir,
                          tta_views=tta_views or config.tta_views)


def suggest_actions(evaluation: Evaluation, train_counts=None, low_recall: float | None = None,
                    pair_share: float = 0.10, merge_share: float = 0.25, top_pairs: int = 5,
                    few_images: float = 0.75) -> "pd.DataFrame":
    """Rules that turn the confusion analysis into next steps, each row with the evidence:

    - more data: recall below `low_recall` (default: 0.1 below the macro recall) and under
      `few_images` x the median class's training images (`train_counts`, else evaluation support);
    - targeted augmentation: a pair where one class loses at least `pair_share` of its images
      to the other (MixUp/CutMix between them, or augmentations that keep their distinguishing cue);
    - merge: two classes that each lose at least `merge_share` of their images to the other.
    """
    import pandas as pd

    counts = evaluation.counts()
    table = evaluation.per_class().iloc[:evaluation.num_classes]
    recall = table["recall"].to_numpy()
    support = table["support"].to_numpy()
    present = support > 0
    sizes = np.asarray(train_counts if train_counts is not None else support, dtype=float)
    source = "training images" if train_counts is not None else "evaluation images"
    threshold = low_recall if low_recall is not None else float(recall[present].mean()) - 0.1
    median_size = float(np.median(sizes[present])) if present.any() else 0.0
    rows = []
    for i in np.argsort(recall, kind="stable"):
        if present[i] and recall[i] < threshold and sizes[i] < few_images * median_size:
            rows.append({"action": "collect more data", "classes": evaluation.classes[i],
                         "evidence": f"recall {recall[i]:.2f} < {threshold:.2f} with {sizes[i]:.0f} {source} "
                                     f"(median class {median_size:.0f})"})
    merged = set()
    for pair in most_confused_pairs(counts, evaluation.classes, top=top_pairs).itertuples():
        key = frozenset((pair.true_index, pair.predicted_index))
        if pair.share_of_true >= merge_share and pair.reverse_share >= merge_share and key not in merged:
            merged.add(key)
            rows.append({"action": "consider merging", "classes": f"{pair.true} + {pair.predicted}",
                         "evidence": f"{pair.share_of_true:.0%} of {pair.true} predicted {pair.predicted} and "
                                     f"{pair.reverse_share:.0%} the other way (both >= {merge_share:.0%})"})
        elif pair.share_of_true >= pair_share and key not in merged:
            rows.append({"action": "targeted augmentation", "classes": f"{pair.true} -> {pair.predicted}",
                         "evidence": f"{pair.images} images ({pair.share_of_true:.0%} of {pair.true}) predicted "
                                     f"{pair.predicted} (>= {pair_share:.0%})"})
    if not rows:
        rows.append({"action": "no action from these rules", "classes": "",
                     "evidence": f"no class below recall {threshold:.2f} with few images, no pair above "
                                 f"{pair_share:.0%}"})
    return pd.DataFrame(rows, columns=["action", "classes", "evidence"])
