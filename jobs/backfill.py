"""spark-submit entry point: offsetlake backfill. Thin on purpose: the work is in offsetlake.jobs.

    spark-submit jobs/backfill.py --pipeline NAME [--dag-id D --run-id R --try-number N --result-file F] ...
"""
import sys

from offsetlake.jobs import backfill_main

if __name__ == "__main__":
    sys.exit(backfill_main())
