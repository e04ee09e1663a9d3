"""The `workbook` command (also `python -m course_lib`): one entry for every task.

Each subcommand lives in the module of its concept; that module's `add_cli(subparsers)`
declares the arguments and sets `func`, which returns the exit code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from course_lib.config import WorkbookError

# Subcommand modules, in the order `workbook --help` lists them.
COMMAND_MODULES = (
    "course_lib.runner",    # run
    "course_lib.hardware",  # doctor
    "course_lib.data",      # data, scan
    "course_lib.bench",     # bench
    "course_lib.train",     # train
    "course_lib.ddp",       # ddp
    "course_lib.metrics",   # eval
    "course_lib.ledger",    # ledger
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbook", description="Fast CNN Training Workbook")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:  # a module not written yet; its command is absent
                continue
            raise
        module.add_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (WorkbookError, FileNotFoundError, NotADirectoryError, FileExistsError) as error:
        # Bad input is a one-line message, not a traceback.
        print(f"workbook {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
