#!/usr/bin/env bash
# Debian packages the project needs beyond Python: installed when missing (as root, e.g. CI), otherwise named
# so a developer can install them. `make` calls it before the venv is built, for what it is about to run:
#   .ci/system-packages.sh          the product and `make demo`
#   .ci/system-packages.sh docs     and what `make docs` needs
#   .ci/system-packages.sh tests    and what `make test` needs (the docs' too)
# The product and the demo:
#   java         openjdk-17-jre-headless   Spark and the Apache Kafka broker run on the JVM
#   mvn          maven                     resolves the JVM stacks' jars from Maven Central (src/offsetlake_local/poms)
#   initdb       postgresql                the demo's captured database (change data capture) and its Hive Metastore's
#                                          catalog; the tests start their own servers (Airflow's metadata too)
#   cc           gcc, libc6-dev            builds the native Kafka reader (src/offsetlake/read/native_reader.c)
#   rdkafka.h    librdkafka-dev            its librdkafka headers (it links to the librdkafka confluent-kafka ships)
# The docs site:
#   npm          npm                       fetches Mermaid, served with the site (docs/assets.py)
# The tests only:
#   ip           iproute2                  network namespaces: the cross-host test's separate hosts
#   chromium     chromium                  the offsetlake view's browser test (Playwright drives it)
#   redis-server redis-server              Celery's broker in the nothing-shared cross-host test
#   promtool     prometheus                checks and tests the alert rules; a real Prometheus scrapes Airflow's metrics
set -euo pipefail

has_postgres() { command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }

missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
has_postgres || missing+=(postgresql)
command -v cc >/dev/null || missing+=(gcc)
[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
[ -e /usr/include/librdkafka/rdkafka.h ] || missing+=(librdkafka-dev)
case "${1:-}" in docs | tests) command -v npm >/dev/null || missing+=(npm) ;; esac
if [ "${1:-}" = tests ]; then
  command -v ip >/dev/null || missing+=(iproute2)
  command -v chromium >/dev/null || missing+=(chromium)
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v promtool >/dev/null || missing+=(prometheus)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 1
fi
# The tests start their own PostgreSQL and Prometheus by PID: the packages must not create and start servers of
# their own (a cluster; a service on all interfaces), so no package starts a service while this installs them.
if [[ " ${missing[*]} " == *" postgresql "* ]] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
  mkdir -p /etc/postgresql-common
  echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
fi
no_services=/usr/sbin/policy-rc.d
if [ ! -e "$no_services" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$no_services" && chmod +x "$no_services"
  trap 'rm -f "$no_services"' EXIT
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
