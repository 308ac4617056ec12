"""The ``treespec`` command: generate, demo, accept, profile, sweep.

The options are parsed (``treespec.cli_parser``) before torch or any model library is imported: ``--help``,
``--version`` and a bad option answer at once. The command then runs from ``treespec.cli_commands``
(``treespec.bench.sweep`` for ``sweep``).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from .cli_parser import build_parser

#: errors a user can cause (bad option values and files, raised as ValueError where they are read; missing or
#: unreadable files and models; a missing optional package): no traceback. Anything else (a TypeError, a
#: KeyError, ...) is a programming error and keeps its traceback.
USER_ERRORS = (ValueError, OSError, ImportError)


def user_message(error: BaseException) -> str:
    """What ``main`` prints for a user error: an OS error on a named file as ``path: reason`` (the shell tools'
    form, without Python's ``[Errno 2]``), anything else as its own message."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``treespec`` command; user errors print ``treespec: error: ...`` and return 2.

    ``--debug`` or ``TREESPEC_DEBUG=1`` re-raises them with their traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("TREESPEC_DEBUG", "") not in ("", "0") or "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        if argv and argv[0] == "sweep":
            from .bench.sweep.cli import main as sweep_main

            return sweep_main(argv[1:]) or 0
        args = build_parser().parse_args(argv)
        from .cli_commands import COMMANDS

        return COMMANDS[args.command](args)
    except USER_ERRORS as error:
        if debug:
            raise
        print(f"treespec: error: {user_message(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        sys.stdout.flush()  # a streamed text ends without its newline: the message starts a line of its own
        print("\ntreespec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
