"""Notebook 13: after training. Making a trained model smaller and faster (pruning, int8
quantization) and serving it outside the training code (torch.export, ONNX and onnxruntime).
Distillation and continual learning train, so they live in the engine."""
