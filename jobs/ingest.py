"""spark-submit entry point: offsetlake ingest. Thin on purpose: the work is in offsetlake.jobs.

    spark-submit jobs/ingest.py --pipeline NAME [--dag-id D --run-id R --try-number N --result-file F] ...
"""
import sys

from offsetlake.jobs import ingest_main

if __name__ == "__main__":
    sys.exit(ingest_main())
