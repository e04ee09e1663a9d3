"""Knowledge distillation: a student learns from a teacher's softened outputs as well as from the
labels (Hinton, Vinyals and Dean 2015, "Distilling the Knowledge in a Neural Network",
arXiv:1503.02531). The loss is

    weight * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - weight) * criterion(student, labels)

The T^2 keeps the soft term's gradients the same size as the hard term's when T changes (Hinton
et al., section 2). When the teacher has fewer outputs than the student, the soft term covers
the teacher's classes only: that is Learning without Forgetting (Li and Hoiem 2016,
arXiv:1606.09282), where the old model's outputs on new images hold the old classes in place.

`fit(config, teacher=Distiller(model, temperature, weight))` turns it on in the engine.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from course_lib.engine.precision import autocast


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(teacher || student) between the temperature-softened distributions, averaged over
    the batch. The student's first `teacher_logits.shape[1]` outputs are compared (all of them when
    the two have as many classes)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    student = student_logits[:, :teacher_logits.shape[1]].float()
    log_student = F.log_softmax(student / temperature, dim=1)
    log_teacher = F.log_softmax(teacher_logits.float() / temperature, dim=1)
    return F.kl_div(log_student, log_teacher, reduction="batchmean", log_target=True) * temperature ** 2


@dataclasses.dataclass
class Distiller:
    """The teacher and the mix: `weight` on the soft term (0 = labels only, 1 = teacher only),
    `temperature` T (Hinton et al. used 1-20; higher spreads the teacher's probability over more
    classes). The teacher stays in eval mode and gets no gradients."""
    teacher: torch.nn.Module
    temperature: float = 4.0
    weight: float = 0.9

    def __post_init__(self):
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"distillation weight must be in [0, 1], got {self.weight}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        self.teacher.eval()  # its logits are computed under no_grad (`bind`): no gradient reaches it

    def to(self, device) -> "Distiller":
        self.teacher.to(device)
        return self

    def bind(self, images: torch.Tensor, criterion, precision: str = "off"):
        """The loss for this batch: `criterion(logits, targets)` mixed with the soft term against
        the teacher's logits on the same (augmented) images. The teacher runs under the student's
        autocast (`precision`): its forward costs as much as the student's, and fp32 would double
        that cost and its activations' memory under AMP; the soft term is computed in fp32 anyway."""
        with torch.no_grad(), autocast(precision, images.device):
            teacher_logits = self.teacher(images)

        def loss(student_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            hard = criterion(student_logits, targets) if self.weight < 1 else student_logits.new_zeros(())
            soft = distillation_loss(student_logits, teacher_logits, self.temperature)
            return self.weight * soft + (1 - self.weight) * hard

        return loss
