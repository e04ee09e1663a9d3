"""Data: datasets and what feeds them to a model, from files to batches on the device (notebook 02). Knows nothing of training."""
