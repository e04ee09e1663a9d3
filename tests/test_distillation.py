"""The distillation loss against its closed forms, and the engine's teacher switch."""
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from course_lib.engine import train
from course_lib.engine.distillation import Distiller, distillation_loss


def test_identical_logits_cost_nothing():
    logits = torch.randn(4, 5)
    assert distillation_loss(logits, logits, temperature=3.0).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_two_class_closed_form(temperature):
    """Teacher logits (0, 0) and student (a, 0): KL(1/2,1/2 || p, 1-p) = -log 2 - (log p + log(1-p)) / 2,
    p = sigmoid(a / T), times T^2."""
    a = 1.5
    p = 1 / (1 + math.exp(-a / temperature))
    expected = temperature ** 2 * (-math.log(2) - 0.5 * (math.log(p) + math.log(1 - p)))
    loss = distillation_loss(torch.tensor([[a, 0.0]]), torch.tensor([[0.0, 0.0]]), temperature)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_the_t_squared_keeps_gradients_the_same_size_at_high_temperature():
    """Hinton et al.: for large T the soft term's gradient is (z_s - z_t) / (N T^2) per logit, so T^2
    times it does not depend on T."""
    teacher = torch.tensor([[0.3, -0.2, 0.1]])
    gradients = []
    for temperature in (20.0, 40.0):
        student = torch.tensor([[0.5, 0.0, -0.5]], requires_grad=True)
        distillation_loss(student, teacher, temperature).backward()
        gradients.append(student.grad.clone())
    expected = ((torch.tensor([[0.5, 0.0, -0.5]]) - teacher) - (torch.tensor([[0.5, 0.0, -0.5]]) - teacher).mean()) / 3
    for gradient in gradients:
        assert torch.allclose(gradient, expected, atol=2e-3)


def test_weight_mixes_soft_and_hard_terms():
    torch.manual_seed(0)
    images, targets = torch.randn(6, 4), torch.randint(0, 3, (6,))
    teacher = torch.nn.Linear(4, 3)
    student_logits = torch.randn(6, 3)
    criterion = torch.nn.CrossEntropyLoss()
    hard = criterion(student_logits, targets).item()
    soft = distillation_loss(student_logits, teacher(images).detach(), 2.0).item()
    for weight in (0.0, 0.3, 1.0):
        loss = Distiller(teacher, temperature=2.0, weight=weight).bind(images, criterion)(student_logits, targets)
        assert loss.item() == pytest.approx(weight * soft + (1 - weight) * hard, rel=1e-5)


@pytest.mark.parametrize("precision, dtype", [("off", torch.float32), ("bf16", torch.bfloat16)])
def test_the_teacher_runs_under_the_students_autocast(precision, dtype):
    """CPU autocast to bf16 (the same call as on a GPU): the teacher's Linear computes in bf16, the
    soft term still in fp32."""
    teacher = torch.nn.Linear(4, 3)
    seen = []
    teacher.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    loss = Distiller(teacher, temperature=2.0, weight=1.0).bind(torch.randn(2, 4), None, precision)(
        torch.randn(2, 3), torch.zeros(2, dtype=torch.long))
    assert seen == [dtype] and loss.dtype == torch.float32


def test_a_teacher_with_fewer_classes_distills_only_its_classes():
    """Learning without Forgetting: the old model's outputs hold the first classes only."""
    student, teacher = torch.randn(3, 5), torch.randn(3, 2)
    assert distillation_loss(student, teacher, 2.0).item() == pytest.approx(
        distillation_loss(student[:, :2], teacher, 2.0).item())


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="weight"):
        Distiller(torch.nn.Linear(2, 2), weight=1.5)
    with pytest.raises(ValueError, match="temperature"):
        distillation_loss(torch.zeros(1, 2), torch.zeros(1, 2), 0.0)


@pytest.mark.slow
def test_fit_with_a_teacher_moves_the_student_towards_it(tmp_path):
    """With weight 1 the student learns only from the teacher: its predictions agree with the teacher's
    more after training than before."""
    config = tiny_config(tmp_path, epochs=2, max_steps=6)
    teacher = train.fit(config.replace(output_dir=str(tmp_path / "teacher")), progress=False, verbose=False).model
    result = train.fit(config.replace(seed=1), progress=False, verbose=False, teacher=Distiller(teacher, 2.0, 1.0))
    assert result.history and all(math.isfinite(row["train_loss"]) for row in result.history)
    images = torch.randn(32, 3, 16, 16)
    with torch.no_grad():
        distance = F.kl_div(F.log_softmax(result.model(images), 1), F.log_softmax(teacher(images), 1),
                            reduction="batchmean", log_target=True).item()
    assert distance < 0.5


@pytest.mark.slow
def test_a_good_teacher_makes_a_better_student_than_labels_alone(tmp_path):
    """A small fixed task where distillation must pay: scikit-learn's digits, a 99% teacher
    (speedrun_resnet_small on the whole training split), and timm's test_resnet as the student on
    100 labelled images for 25 epochs (15 left the distilled student short of its soft targets: on an Intel Xeon
    without AMX, gains 1.1, 0.7, 4.1, -0.7 points over seeds 0-3; at 25 epochs 1.9, 4.8, 5.6, 4.5). The distilled
    student beats the same student trained on labels, seed by seed, through the loop notebook 13 runs:
    `train.fit(..., teacher=Distiller(...))` against `train.fit(...)`."""
    from course_lib.chapters import compress_and_deploy
    from course_lib.config import make_config
    from course_lib.engine.distillation import Distiller
    from course_lib.data import pipeline

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = make_config("smoke", dataset="digits", image_size=16, batch_size=32, max_steps=0, max_train_images=0,
                             epochs=5, lr=0.1, model="speedrun_resnet_small", output_dir=str(tmp_path / "teacher"))
        teacher = train.fit(config, bundle=pipeline.build_datasets(config), progress=False, verbose=False)
        assert teacher.history[-1]["val_top1"] > 0.95
        student = config.replace(model="test_resnet", max_train_images=100, epochs=25,
                                 output_dir=str(tmp_path / "students"))
        bundle, rows = pipeline.build_datasets(student), []
        for seed in range(2):
            for method, distiller in (("labels only", None), ("distilled", Distiller(teacher.model, 4.0, 0.9))):
                run = student.replace(seed=seed, output_dir=str(tmp_path / "students" / f"{method}-{seed}"))
                result = train.fit(run, bundle=bundle, teacher=distiller, progress=False, verbose=False)
                rows.append(compress_and_deploy.describe(result.model, bundle, run, compress_and_deploy.SMOKE_SPEED,
                                                         method=method, seed=seed))
    finally:
        torch.set_num_threads(previous)
    top1 = {(row["method"] == "labels only", row["seed"]): row["val top-1"] for row in rows}
    gains = [top1[False, seed] - top1[True, seed] for seed in range(2)]
    print("distillation gains (points):", [round(100 * g, 1) for g in gains])
    assert min(gains) > 0 and sum(gains) / 2 >= 0.015, gains
