"""spark-submit entry point for `offsetlake backfill`: the same code as the command line, nothing else.

spark-submit jobs/backfill.py --pipeline NAME [--dag-id D --run-id R --try-number N] [options of offsetlake backfill]
"""

import sys

from offsetlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["backfill", *sys.argv[1:]]))
