#!/usr/bin/env bash
# Debian packages the project needs beyond Python: installed when missing (as root, e.g. CI),
# otherwise named so a developer can install them. Called by `make` before the venv is built.
#   java        openjdk-17-jre-headless   Spark and the Apache Kafka broker run on the JVM
#   mvn         maven                     resolves the broker's jars from Maven Central (src/offsetlake_local/poms)
#   initdb      postgresql                Airflow's metadata database in the Airflow tests (one server per session) and the cross-host test
#   ip          iproute2                  network namespaces: the cross-host test's separate hosts
#   chromium    chromium                  the offsetlake view's browser test (Playwright drives it)
#   redis-server redis-server             Celery's broker in the nothing-shared cross-host test
set -euo pipefail

has_postgres() { command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }

missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
has_postgres || missing+=(postgresql)
command -v ip >/dev/null || missing+=(iproute2)
command -v chromium >/dev/null || missing+=(chromium)
command -v redis-server >/dev/null || missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 1
fi
# The tests start their own PostgreSQL by PID: the package must not create and start a cluster of its own.
if [[ " ${missing[*]} " == *" postgresql "* ]] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
  mkdir -p /etc/postgresql-common
  echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
