"""The training engine: the loop (`train.py`) and each switch in a module named after it."""
