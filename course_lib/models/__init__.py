"""Models: building timm models, loading weights from checkpoints and the hub. Needs no training loop.

Importing the package registers the workbook's own architectures with timm (as `timm.models` imports its model modules),
so `timm.create_model("speedrun_resnet")` (or "vit_tiny_patch8_64") works wherever `course_lib.models` was imported.
"""
from course_lib.models import small_vit, speedrun  # noqa: F401  (register the small ViTs and the speedrun_resnet nets)
