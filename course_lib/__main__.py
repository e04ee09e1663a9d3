"""`python -m course_lib` is the `workbook` command (and what torchrun workers run)."""
import sys

from course_lib.engine.worker_lifetime import end_with_parent, under_torchrun

if under_torchrun():  # first, before torch loads: a worker ends with its agent, even a SIGKILLed one
    end_with_parent()

from course_lib.cli import main  # after the worker's parent-death signal is set

sys.exit(main())
