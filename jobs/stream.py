"""spark-submit entry point for `offsetlake stream`: the same code as the command line, nothing else.

spark-submit jobs/stream.py --pipeline NAME [--dag-id D --run-id R --try-number N] [options of offsetlake stream]
"""

import sys

from offsetlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
