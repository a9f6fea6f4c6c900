"""Separate hosts on this machine, for tests that cross a network: network namespaces on a private
/24 that exists only while the test runs, a PostgreSQL server, and a Spark standalone cluster.

Everything is started by the test and stopped by PID. Servers bind 127.0.0.1 or an address of a
test host. When something needed is not on the machine, the test fails naming it (CI installs
it: see .ci/run); it never skips.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from offsetlake_local import broker, postgres, processes
from offsetlake_local.postgres import Postgres


def require(ok: bool, what: str, how: str) -> None:
    if not ok:
        pytest.fail(f"{what} is missing: {how}", pytrace=False)


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    name: str  # the network namespace
    address: str

    def command(self, *args: str, hide: tuple[Path, ...] = ()) -> list[str]:
        """`args` run inside this host's network namespace (ip netns exec execs: the PID is the command's).

        `hide`: directories of the other hosts, each covered by an empty tmpfs in a mount namespace of the
        command's own, so that it cannot use them: what it needs of another host it must get over the
        network. (unshare and sh exec too: the PID stays the command's.)"""
        if hide:
            mounts = " && ".join(f"mount -t tmpfs -o size=1m offsetlake-hidden {shlex.quote(str(p))}" for p in hide)
            args = ("unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh", *args)
        return ["ip", "netns", "exec", self.name, *args] if self.name else list(args)


LOOPBACK = Host("", "127.0.0.1")  # this machine, for tests that need a cluster but not a network


@dataclass
class PrivateNetwork:
    """A bridge in the root namespace (the test machine: .1) and one namespace per test host (.2, .3...)."""

    tag: str
    subnet: str  # "10.x.y": a /24 no route of this machine uses
    hosts: list[Host] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"olbr{self.tag}"

    @property
    def root_address(self) -> str:
        return f"{self.subnet}.1"

    @staticmethod
    def create() -> PrivateNetwork:
        require(shutil.which("ip") is not None, "iproute2 (the ip command)", "apt-get install iproute2")
        require(os.geteuid() == 0, "root", "network namespaces need root (CI runs as root)")
        net = PrivateNetwork(tag=f"{os.getpid() % 100000}", subnet=_free_subnet())
        _run("ip", "link", "add", net.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{net.root_address}/24", "dev", net.bridge)
        _run("ip", "link", "set", net.bridge, "up")
        return net

    def add_host(self, role: str) -> Host:
        index = len(self.hosts) + 2
        host = Host(f"ol{role}{self.tag}", f"{self.subnet}.{index}")
        outside, inside = f"olv{self.tag}h{index}", f"olv{self.tag}n{index}"
        _run("ip", "netns", "add", host.name)
        self.hosts.append(host)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", host.name)
        _run("ip", "link", "set", outside, "master", self.bridge, "up")
        _run("ip", "-n", host.name, "addr", "add", f"{host.address}/24", "dev", inside)
        _run("ip", "-n", host.name, "link", "set", inside, "up")
        _run("ip", "-n", host.name, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        for host in self.hosts:  # deleting a namespace deletes its end of the veth pair, and so both ends
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def _free_subnet() -> str:
    used = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for second in range(250, 255):
        for third in range(os.getpid() % 200, 256):
            subnet = f"10.{second}.{third}"
            if f"{subnet}." not in used:
                return subnet
    raise RuntimeError("no free 10.250-254.x.0/24 subnet for the test network")


def wait_for(condition, what: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise AssertionError(f"{what}: the process exited with {proc.returncode}\n{tail}")
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise AssertionError(f"{what}: not within {timeout:.0f}s\n{tail}")
        time.sleep(0.5)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, outside the range outgoing connections take theirs from (broker.free_ports)."""
    return broker.free_port(host)


def start_postgres(network: PrivateNetwork | None = None, settings: dict[str, str] | None = None) -> Postgres:
    """The product's PostgreSQL server (offsetlake_local.postgres); with a network, also on its root address,
    trusting the network's hosts."""
    require(postgres_installed(), "PostgreSQL (initdb, postgres)", "apt-get install postgresql")
    if network is None:
        return postgres.start(settings=settings)
    return postgres.start(listen=(network.root_address,), trust_subnets=(f"{network.subnet}.0/24",), settings=settings)


def postgres_installed() -> bool:
    try:
        postgres._bin_dir()
        return True
    except Exception:
        return False


@dataclass
class SparkStandalone:
    """A Spark standalone master and one worker (spark-class from the pyspark package) on one test host."""

    host: Host
    master_pid: int
    worker_pid: int
    work_dir: Path
    port: int = 7077
    ui_port: int = 18080

    @property
    def master_url(self) -> str:
        return f"spark://{self.host.address}:{self.port}"

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://{self.host.address}:{self.ui_port}/json/", timeout=5) as resp:
            return json.loads(resp.read())

    @staticmethod
    def start(
        host: Host,
        root: Path,
        cores: int = 2,
        memory: str = "2g",
        port: int = 7077,
        ui_port: int = 18080,
        worker_ui_port: int = 18081,
        hide: tuple[Path, ...] = (),
        env: dict[str, str] | None = None,
    ) -> SparkStandalone:
        """`hide`: the other hosts' directories (see Host.command); `env`: the host's own (HOME...)."""
        spark_class = Path(sys.executable).parent / "spark-class"
        require(spark_class.exists(), "spark-class", "pip install pyspark (requirements.txt)")
        work = root / "spark-work"
        work.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": host.address,
            "SPARK_LOG_DIR": str(root),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
            **(env or {}),
        }
        master_log, worker_log = root / "spark-master.log", root / "spark-worker.log"
        master = _popen(
            host.command(
                str(spark_class),
                "org.apache.spark.deploy.master.Master",
                "--host",
                host.address,
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
                hide=hide,
            ),
            env,
            master_log,
        )
        cluster = SparkStandalone(host, master.pid, 0, work, port, ui_port)
        try:  # a start that fails stops what it started: nobody else knows its PIDs yet
            cluster._start_worker(master, master_log, worker_log, spark_class, env, hide, cores, memory, worker_ui_port)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_worker(
        self, master, master_log, worker_log, spark_class, env, hide, cores, memory, worker_ui_port
    ) -> None:
        """Wait for the master, then start the worker and wait until it registered."""
        cluster, host, work = self, self.host, self.work_dir
        wait_for(lambda: _answers(cluster), "Spark master", 90, master, master_log)
        worker = _popen(
            host.command(
                str(spark_class),
                "org.apache.spark.deploy.worker.Worker",
                cluster.master_url,
                "--host",
                host.address,
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(worker_ui_port),
                "--work-dir",
                str(work),
                hide=hide,
            ),
            env,
            worker_log,
        )
        cluster.worker_pid = worker.pid
        wait_for(
            lambda: any(w.get("state") == "ALIVE" for w in cluster.state().get("workers", [])),
            "a Spark worker registered with the master",
            90,
            worker,
            worker_log,
        )

    def executor_pids(self) -> list[int]:
        """The executor JVMs the worker runs now (CoarseGrainedExecutorBackend, its descendants)."""
        return [pid for pid in descendants(self.worker_pid) if b"CoarseGrainedExecutorBackend" in _cmdline(pid)]

    def executor_dirs(self) -> list[Path]:
        """One directory per executor the worker ever launched: <work>/<app id>/<executor id>."""
        return sorted(p for p in self.work_dir.glob("app-*/*") if p.is_dir())

    def applications(self) -> list[dict]:
        state = self.state()
        return state.get("activeapps", []) + state.get("completedapps", [])

    def stop(self) -> None:
        for pid in (self.worker_pid, self.master_pid):
            if pid:
                processes.stop(pid, timeout=20)


def descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc (children, their children...)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _answers(cluster: SparkStandalone) -> bool:
    try:
        return cluster.state().get("status") == "ALIVE"
    except (OSError, ValueError):  # ValueError: while it starts, the master's UI may answer /json/ with a page
        return False


def _popen(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


@dataclass
class S3Server:
    """moto's S3 server (`python -m moto.server`, from PyPI: what LocalStack's S3 runs on) on 127.0.0.1, in
    memory, one bucket. The tests rely on its conditional writes (PutObject with If-None-Match answers 412
    when the key exists: the put-if-absent of a Delta commit) and on listing in key order."""

    pid: int
    port: int
    log: Path
    bucket: str = "lake"
    access_key: str = "offsetlake"
    secret_key: str = "s3cret-object-store-key"
    address: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def storage_options(self, **extra: str) -> dict[str, str]:
        """A table's storage_options for this server, put-if-absent by S3 conditional writes."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ALLOW_HTTP": "true",
            "conditional_put": "etag",
            **extra,
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    @staticmethod
    def start(
        work: Path, host: Host = LOOPBACK, hide: tuple[Path, ...] = (), checks_credentials: bool = False
    ) -> S3Server:
        """On 127.0.0.1, or on a test host's address inside its namespace. moto accepts any credentials
        unless `checks_credentials`: then only the key of an IAM user it made (S3's 403 for any other)."""
        port = free_port() if host is LOOPBACK else 9000
        log = work / "s3.log"
        env = dict(os.environ)
        if checks_credentials:  # moto checks requests after this many: the bucket and the IAM user's set-up
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(1 + len(IAM_SETUP))
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                host.command(sys.executable, "-m", "moto.server", "-H", host.address, "-p", str(port), hide=hide),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        server = S3Server(proc.pid, port, log, address=host.address)
        wait_for(server._accepts, "moto's S3 server accepting connections", 60, proc, log)
        server.client().create_bucket(Bucket=server.bucket)
        if checks_credentials:
            server.access_key, server.secret_key = server._iam_user()
        return server

    def _iam_user(self) -> tuple[str, str]:
        """An IAM user allowed every S3 action, and its access key (moto's IAM, on the same port)."""
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.url,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
            region_name="us-east-1",
        )
        for action, args in IAM_SETUP:
            answer = getattr(iam, action)(**args)
        return answer["AccessKey"]["AccessKeyId"], answer["AccessKey"]["SecretAccessKey"]

    def _accepts(self) -> bool:
        try:
            socket.create_connection((self.address, self.port), 0.5).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        processes.stop(self.pid, timeout=20)


IAM_SETUP = [
    ("create_user", {"UserName": "offsetlake"}),
    (
        "put_user_policy",
        {
            "UserName": "offsetlake",
            "PolicyName": "lake",
            "PolicyDocument": json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
            ),
        },
    ),
    ("create_access_key", {"UserName": "offsetlake"}),
]


@dataclass
class Redis:
    """redis-server (Debian's redis-server package) on a given address, in memory: Celery's broker."""

    pid: int
    address: str
    port: int
    password: str

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.address}:{self.port}/0"

    @staticmethod
    def start(address: str, work: Path) -> Redis:
        binary = shutil.which("redis-server")
        require(binary is not None, "redis-server", "apt-get install redis-server (.ci/system-packages.sh)")
        port = free_port(address)
        password = secrets.token_urlsafe(16)  # Redis refuses other hosts without one (protected mode)
        log = work / "redis.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [binary, "--bind", address, "--port", str(port), "--save", "", "--appendonly", "no"]
                + ["--requirepass", password],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=work,
            )
        server = Redis(proc.pid, address, port, password)
        wait_for(lambda: _connects(address, port), "redis-server accepting connections", 30, proc, log)
        return server

    def stop(self) -> None:
        processes.stop(self.pid, timeout=20)


def _connects(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), 0.5).close()
        return True
    except OSError:
        return False
