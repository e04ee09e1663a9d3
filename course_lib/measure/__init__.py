"""Measuring the machine and the workbook's own speed: inventory, topology, peak FLOP/s, the doctor, memory, FLOPs, timing, benchmarks."""
