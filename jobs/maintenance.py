"""spark-submit entry point for `offsetlake maintain`: the same code as the command line, nothing else.

spark-submit jobs/maintenance.py --pipeline NAME [--dag-id D --run-id R --try-number N] [options of offsetlake maintain]
"""

import sys

from offsetlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["maintain", *sys.argv[1:]]))
