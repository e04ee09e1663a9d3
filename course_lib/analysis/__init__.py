"""After training: metrics, calibration, confusion matrices, evaluations, the explorer, statistics. Never imports the engine."""
