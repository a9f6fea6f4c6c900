"""spark-submit entry point for `offsetlake ingest`: the same code as the command line, nothing else.

spark-submit jobs/ingest.py --pipeline NAME [--dag-id D --run-id R --try-number N] [options of offsetlake ingest]
"""

import sys

from offsetlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["ingest", *sys.argv[1:]]))
