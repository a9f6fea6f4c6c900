"""A PostgreSQL server of the machine's postgresql package, in a directory of its own, stopped by PID.

The captured database of the change-data-capture tests (`settings=LOGICAL_DECODING`), the Airflow tests' metadata
database and the cross-host test's all start here. `initdb` makes a cluster with one superuser that every
local connection is trusted as; the server listens on 127.0.0.1 (and any address given, e.g. a test network's)
and keeps its socket in its own directory. Run as root (CI), the server runs as the `postgres` user (or
`nobody`): PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from offsetlake.errors import OffsetlakeError
from offsetlake.local import processes
from offsetlake.local.broker import free_port

# What Debezium's PostgreSQL connector needs of a server (pgoutput ships with PostgreSQL 10+): logical
# decoding, and a replication slot and WAL sender for each connector (and a spare for a restarted one).
LOGICAL_DECODING = {"wal_level": "logical", "max_replication_slots": "8", "max_wal_senders": "8"}
START_TIMEOUT_SECONDS = 60


@dataclass
class Postgres:
    """A running server: `pid` is the postmaster's; `user` is its superuser, trusted from the listed addresses."""

    pid: int
    port: int
    root: Path
    database: str = "airflow"
    user: str = "airflow"
    address: str = "127.0.0.1"  # where other hosts reach it

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def network_url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@{self.address}:{self.port}/{self.database}"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def connect(self, database: str | None = None):
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname=database or self.database, connect_timeout=3
        )

    def execute(self, *statements: str, database: str | None = None) -> None:
        """Each statement in autocommit (CREATE DATABASE cannot run in a transaction)."""
        conn = self.connect(database)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
        finally:
            conn.close()

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster, by PID), then remove its files."""
        try:
            os.kill(self.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        processes.stop(self.pid, timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


def start(
    database: str = "airflow",
    user: str = "airflow",
    listen: tuple[str, ...] = (),
    trust_subnets: tuple[str, ...] = (),
    settings: dict[str, str] | None = None,
    port: int | None = None,
) -> Postgres:
    """A new cluster with `database`, on 127.0.0.1 and the `listen` addresses, trusting `trust_subnets`
    (CIDRs, e.g. a test network's); `settings` are server parameters (`LOGICAL_DECODING`)."""
    bin_dir = _bin_dir()
    root = Path(tempfile.mkdtemp(prefix="offsetlake-pg-"))
    root.chmod(0o755)
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    account = _server_account()
    if account is not None:
        os.chown(root, account.pw_uid, account.pw_gid)
        os.chown(sockets, account.pw_uid, account.pw_gid)
    demote = _demote(account)
    init = subprocess.run(
        [str(bin_dir / "initdb"), "-D", str(data), "-U", user, "--auth=trust", "--encoding=UTF8", "--no-sync"],
        capture_output=True,
        text=True,
        preexec_fn=demote,
    )
    if init.returncode != 0:
        raise OffsetlakeError(f"initdb failed: {(init.stderr.strip().splitlines() or ['(no output)'])[-1]}")
    if trust_subnets:
        with open(data / "pg_hba.conf", "a") as hba:
            hba.writelines(f"host all all {subnet} trust\n" for subnet in trust_subnets)
            hba.writelines(f"host replication all {subnet} trust\n" for subnet in trust_subnets)
    port = port or free_port()
    parameters = {"listen_addresses": ",".join(("127.0.0.1", *listen)), "fsync": "off", **(settings or {})}
    command = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets)]
    for name, value in parameters.items():
        command += ["-c", f"{name}={value}"]
    with open(root / "postgres.log", "ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=demote,
            start_new_session=True,
        )
    server = Postgres(proc.pid, port, root, database, user, address=listen[0] if listen else "127.0.0.1")
    _wait(server, proc)
    server.execute(f'CREATE DATABASE "{database}"', database="postgres")
    return server


def _wait(server: Postgres, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        try:
            server.connect("postgres").close()
            return
        except Exception:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = server.log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            processes.stop(proc.pid)
            raise OffsetlakeError(f"PostgreSQL did not start on port {server.port}: {tail[0]} (see {server.log})")
        time.sleep(0.3)


def _bin_dir() -> Path:
    found = shutil.which("initdb")
    if found and (Path(os.path.realpath(found)).parent / "postgres").exists():
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_major)
    if not versions:
        raise OffsetlakeError("PostgreSQL is not installed (apt-get install postgresql)")
    return Path(versions[-1]).parent


def _major(path: str) -> int:
    try:
        return int(Path(path).parent.parent.name)
    except ValueError:
        return 0


def _server_account():
    if os.geteuid() != 0:
        return None  # not root: the server runs as us
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise OffsetlakeError("no postgres or nobody user to run PostgreSQL as (it refuses to run as root)")


def _demote(account):
    if account is None:
        return None

    def become():
        os.setgid(account.pw_gid)
        os.setuid(account.pw_uid)

    return become
