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
from offsetlake_local import processes
from offsetlake_local.broker import free_port

# What Debezium's PostgreSQL connector needs of a server (pgoutput ships with PostgreSQL 10+): logical
# decoding, and a replication slot and WAL sender for each connector (and a spare for a restarted one).
LOGICAL_DECODING = {"wal_level": "logical", "max_replication_slots": "8", "max_wal_senders": "8"}
START_TIMEOUT_SECONDS = 60
ROOT_PREFIX = "offsetlake-pg-"  # each server's temporary directory: its data, socket and log


@dataclass
class Postgres:
    """A running server: `pid` is the postmaster's; `user` is its superuser, trusted from the listed addresses."""

    pid: int
    port: int
    root: Path
    database: str = "airflow"
    user: str = "airflow"
    address: str = "127.0.0.1"  # where other hosts reach it

    @classmethod
    def at(cls, port: int, user: str, database: str) -> Postgres:
        """A server another process started, on 127.0.0.1: to connect to (only its owner stops it)."""
        return cls(pid=0, port=port, root=Path(), database=database, user=user)

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

    def current_lsn(self) -> int:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn() - '0/0'")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    def wait_confirmed(self, slot: str, timeout: float = 90) -> None:
        """Until replication slot `slot` has confirmed every change made so far: Debezium confirms an LSN once
        the events up to it are in Kafka (acknowledged) and its offsets flushed."""
        target = self.current_lsn()
        deadline = time.monotonic() + timeout
        while True:
            conn = self.connect()
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                    )
                    found = cur.fetchone()
            finally:
                conn.close()
            if found and found[0] is not None and int(found[0]) >= target:
                return
            if time.monotonic() > deadline:
                raise OffsetlakeError(f"slot {slot} confirmed {found} < LSN {target} after {timeout:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster, by PID), then remove its files."""
        if not self.pid:  # Postgres.at: not ours (and os.kill(0) would signal our whole process group)
            raise OffsetlakeError(f"the PostgreSQL server on port {self.port} was started by another process")
        try:
            os.kill(self.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        processes.stop(self.pid, timeout=30)
        if self.root.name.startswith(ROOT_PREFIX):  # the directory `start` made, never another
            shutil.rmtree(self.root, ignore_errors=True)


def start(
    database: str = "airflow",
    user: str = "airflow",
    listen: tuple[str, ...] = (),
    trust_subnets: tuple[str, ...] = (),
    settings: dict[str, str] | None = None,
    port: int | None = None,
    pid_file: Path | None = None,
    root: Path | None = None,
) -> Postgres:
    """A new cluster with `database`, on 127.0.0.1 and the `listen` addresses, trusting `trust_subnets`
    (CIDRs, e.g. a test network's); `settings` are server parameters (`LOGICAL_DECODING`). `pid_file`: for
    another process to stop it (`stop_from_pid_file`). `root`: where the cluster lives across runs (the
    demo's); started again on it, the same cluster. Without it, a temporary directory that `stop` removes."""
    bin_dir = _bin_dir()
    root = root or Path(tempfile.mkdtemp(prefix=ROOT_PREFIX))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir(exist_ok=True)
    account = _server_account()
    if account is not None:
        os.chown(root, account.pw_uid, account.pw_gid)
        os.chown(sockets, account.pw_uid, account.pw_gid)
    demote = _demote(account)
    existing = (data / "PG_VERSION").exists()
    if not existing:
        _initdb(bin_dir, data, user, trust_subnets, demote)
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
    if pid_file is not None:
        pid_file.write_text(f"{proc.pid}\n")
    _wait(server, proc)
    if not existing:
        server.execute(f'CREATE DATABASE "{database}"', database="postgres")
    return server


def _initdb(bin_dir: Path, data: Path, user: str, trust_subnets: tuple[str, ...], demote) -> None:
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


def stop_from_pid_file(pid_file: Path) -> bool:
    """Stop the server a pid file names (fast shutdown), if it still runs, and remove its files. True if it ran."""
    pid = processes.read_pid(pid_file)
    pid_file.unlink(missing_ok=True)
    if not processes.runs(pid, "postgres"):
        return False
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    root = Path(arguments[arguments.index("-D") + 1]).parent  # stop removes it only if `start` made it temporary
    Postgres(pid, 0, root).stop()
    return True


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
