"""Models: building timm models, loading weights from checkpoints and the hub. Needs no training loop.

Importing the package registers the workbook's own architectures with timm (as `timm.models`
imports its model modules), so `timm.create_model("speedrun_resnet")` works wherever
`course_lib.models` was imported.
"""
from course_lib.models import speedrun  # noqa: F401  (registers speedrun_resnet and speedrun_resnet_small)
