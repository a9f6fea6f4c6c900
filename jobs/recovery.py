"""spark-submit entry point for `offsetlake recover`: the same code as the command line, nothing else.

spark-submit jobs/recovery.py --pipeline NAME [--dag-id D --run-id R --try-number N] [options of offsetlake recover]
"""

import sys

from offsetlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["recover", *sys.argv[1:]]))
