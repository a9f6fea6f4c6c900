"""spark-submit entry point: offsetlake recovery. Thin on purpose: the work is in offsetlake.jobs.

    spark-submit jobs/recovery.py --pipeline NAME [--dag-id D --run-id R --try-number N --result-file F] ...
"""
import sys

from offsetlake.jobs import recovery_main

if __name__ == "__main__":
    sys.exit(recovery_main())
