"""`python -m course_lib` is the `workbook` command (and what torchrun workers run)."""
import sys

from course_lib.cli import main

sys.exit(main())
