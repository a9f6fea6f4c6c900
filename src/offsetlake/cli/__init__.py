"""The `offsetlake` command. Exit 0 on success; on failure one line on stderr and a non-zero exit.

`arguments` defines every command's flags; `commands` turns them into library calls (mostly
offsetlake.runs) and prints what they say.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys

from offsetlake.cli.arguments import build_parser
from offsetlake.cli.commands import COMMANDS, pipeline_json_schema
from offsetlake.errors import OffsetlakeError, one_line

EXIT_FAILED = 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # `kill -USR1 <pid>` prints every thread's Python stack to stderr: where a job that seems stuck waits.
    with contextlib.suppress(ValueError, OSError):  # OSError: a stderr with no file behind it (in-process)
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s", stream=sys.stderr
    )
    logging.getLogger("offsetlake.librdkafka").setLevel(logging.CRITICAL)
    try:
        return COMMANDS[args.command](args) or 0
    except OffsetlakeError as err:
        print(f"offsetlake: error: {one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("offsetlake: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # still one line; the traceback only when asked for
        if os.environ.get("OFFSETLAKE_DEBUG"):
            raise
        print(f"offsetlake: error: {type(err).__name__}: {one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
