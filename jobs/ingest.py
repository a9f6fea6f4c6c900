"""spark-submit entry point: ingest one pipeline up to the current end offsets.

    spark-submit jobs/ingest.py --pipeline demo_events [--dag-id D --run-id R --try-number N]

Thin on purpose: parse arguments, build the session, call offsetlake.
"""
import argparse
import sys

from offsetlake.batch import ingest
from offsetlake.config import load_pipeline
from offsetlake.errors import OffsetlakeError
from offsetlake.ledger import RunInfo
from offsetlake.spark import build_session


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jobs/ingest.py")
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--pipelines-dir")
    parser.add_argument("--dag-id")
    parser.add_argument("--run-id")
    parser.add_argument("--try-number", type=int)
    args = parser.parse_args(argv)
    run = RunInfo("airflow", args.dag_id, args.run_id, args.try_number) if args.dag_id else RunInfo.from_env()
    try:
        cfg = load_pipeline(args.pipeline, args.pipelines_dir)
        spark = build_session(f"offsetlake-ingest-{cfg.name}")
        try:
            for result in ingest(spark, cfg, run):
                print(result.summary(), flush=True)
        finally:
            spark.stop()
    except OffsetlakeError as err:
        print(f"offsetlake: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
