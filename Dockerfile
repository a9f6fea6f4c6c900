# One image for Spark (master, worker, driver) and Airflow: the same pinned Python dependencies
# everywhere, so executors can import offsetlake and the pyspark/Spark versions always match.
FROM python:3.11.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini gcc libc6-dev librdkafka-dev \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    OFFSETLAKE_HOME=/opt/offsetlake \
    PYSPARK_PYTHON=/usr/local/bin/python \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
WORKDIR /opt/offsetlake
COPY requirements.txt pyproject.toml ./
RUN pip install --no-cache-dir -r requirements.txt
COPY src ./src
RUN pip install --no-cache-dir --no-deps -e . \
 && python -m offsetlake.spark.jvm_archive \
 && python -m offsetlake.read.native \
 && python -m offsetlake.formats.native
# jvm_archive: Spark driver classes pre-parsed, sessions start ~2 s sooner; native: the C Kafka reader and
# the formats' C decoders
COPY jobs ./jobs
COPY dags ./dags
COPY include ./include
COPY plugins ./plugins
ENTRYPOINT ["/usr/bin/tini", "--"]
