"""The Fast CNN Training Workbook's library. Subpackages map onto the chapters:

- `data/`: datasets, decoders, transforms, the pre-decoded cache, tar shards, device augmentation,
  loaders and `scan` (notebook 02);
- `models/`: building timm models, checkpoints, pretrained weights on the hub (notebook 08);
- `engine/`: the training loop and its switches: precision, schedules, accumulation, DDP,
  MixUp/CutMix, random erasing, label smoothing, EMA, freezing (notebooks 03-07);
- `measure/`: inventory, topology, peak FLOP/s, the doctor, memory, FLOPs, timing, benchmarks
  (notebooks 01-02);
- `analysis/`: metrics, calibration, confusion matrices, evaluation, the explorer, statistics
  (notebooks 07, 09);
- `chapters/`: what only one notebook needs (00, 07, 08, 10, 11, 12).

Leaves at the top: `config` (the one Config dataclass and its profiles), `paths`, `devices`,
`ledger`, `runner`, `cli`.
"""
__version__ = '0.1.0'
