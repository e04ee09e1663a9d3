"""Models: building timm models, loading weights from checkpoints and the hub. Needs no training loop."""
