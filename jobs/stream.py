"""spark-submit entry point: offsetlake stream. Thin on purpose: the work is in offsetlake.jobs.

    spark-submit jobs/stream.py --pipeline NAME [--dag-id D --run-id R --try-number N --result-file F] ...
"""
import sys

from offsetlake.jobs import stream_main

if __name__ == "__main__":
    sys.exit(stream_main())
