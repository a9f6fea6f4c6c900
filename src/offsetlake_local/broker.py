"""The embedded Apache Kafka broker of the tests and `make demo`: KRaft nodes started with pid files, ready
once a metadata request lists them, stopped by PID.

Each node is one JVM (`kafka.Kafka`) in combined mode (broker and controller in one process, as Kafka's
quick start runs it), with its own directory holding `server.properties`, the KRaft log and `broker.log`. The
jars come from Maven Central through `offsetlake_local.jars` (the `kafka-broker` POM pins the version).

- `start(dir)`: one node (replication factor 1), the demo's and the shared test broker. Started again on the
  same directory, it reuses its configuration (ports, cluster id) and data: a restart, as in production.
- `start_cluster(dir, 3)`: three nodes, a controller quorum of three, replication factor 3 and
  `min.insync.replicas` 2, so one node can die (SIGKILL) while leaders move to the others.
- `listeners`: extra listeners (SASL/SCRAM-SHA-512, SSL) and ACLs for the security tests
  (`offsetlake_local.broker_security`); the PLAINTEXT listener stays for the harness, as a super user.
- `stack`: another POM of broker jars (`kafka-broker-4.1`: Apache Kafka 4.1.2), kept in the node's directory
  so that a restart runs the same release. `python -m offsetlake_local.broker start|stop` starts nodes that
  outlive the command, for a benchmark's `--bootstrap` (docs/speed.md, "On another broker").

Measured on the 2-core machine this was written on (Apache Kafka 4.4.0, Java 17): a node answers its first
metadata request 3-5 s after the JVM starts (formatting the directory takes another ~1 s, once); a
three-node cluster, started together, 9-10 s; each node's JVM holds 320-440 MB resident under the tests'
load (heap capped at `HEAP`).
"""

from __future__ import annotations

import base64
import os
import random
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from offsetlake.errors import KafkaError, OffsetlakeError
from offsetlake_local import jars, jvm, processes

HOST = "127.0.0.1"
MARKER = "kafka.Kafka"
KAFKA_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
HEAP = os.environ.get("OFFSETLAKE_BROKER_HEAP", "768m")
CONFIG = "server.properties"
STACK = "kafka-broker"  # the POM of the broker's jars (offsetlake_local.jars); another names another Kafka
STACK_FILE = "jvm-stack"  # a node directory's stack, so that a restart runs the same Kafka
INFO_LOGGERS = ("kafka.server.KafkaRaftServer", "kafka.server.BrokerServer")  # their info lines say a node is up

# What every embedded node sets beyond Kafka's defaults, and why.
COMMON = {
    "group.initial.rebalance.delay.ms": "0",  # the tests' consumer groups need not wait for more members
    # Fewer internal partitions than Kafka's 50: each is a log (files, a leader election) on a 2-core machine.
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.num.partitions": "8",
    # An abandoned transaction is aborted within its producer's transaction.timeout.ms plus this check's
    # period (Kafka's default period is 10 s): the LSO it held back moves on.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "transaction.max.timeout.ms": "900000",
    "log.retention.check.interval.ms": "5000",
    "auto.create.topics.enable": "false",  # a mistyped topic is an error, not a new empty topic
    "controlled.shutdown.enable": "true",
}


@dataclass
class Broker:
    """One running node: `pid` is the JVM's own (SIGTERM reaches it)."""

    pid: int
    port: int
    data_dir: Path
    host: str = HOST
    node_id: int = 1
    listeners: dict[str, int] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class Cluster:
    """Nodes that form one cluster; `bootstrap_servers` names them all."""

    nodes: list[Broker]
    data_dir: Path

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap_servers for n in self.nodes)

    def node(self, node_id: int) -> Broker:
        return next(n for n in self.nodes if n.node_id == node_id)

    def kill(self, node_id: int) -> None:
        """SIGKILL one node: no controlled shutdown, as a machine that dies."""
        processes.kill(self.node(node_id).pid)

    def stop_node(self, node_id: int) -> None:
        """SIGTERM one node (a controlled shutdown: it hands its leaders over first)."""
        stop(self.node(node_id).pid)

    def start_node(self, node_id: int, timeout: float = 90.0) -> Broker:
        """Start a stopped or killed node again on its directory; ready once the cluster lists it."""
        old = self.node(node_id)
        proc = _launch(old.data_dir, old.host, None)
        new = _node(proc.pid, old.data_dir, old.host)
        _wait([proc], [new], expected=len(self.nodes), timeout=timeout)
        self.nodes[self.nodes.index(old)] = new
        return new

    def stop(self) -> None:
        """SIGTERM every node at once (one by one, the last would wait for a quorum that has gone)."""
        processes.stop_all([n.pid for n in self.nodes])


def free_port(host: str = HOST) -> int:
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = HOST) -> list[int]:
    """`count` distinct ports free now (each socket stays bound until all are chosen), drawn below the kernel's
    ephemeral range: the port a server is given is bound by it a moment later, and a port of that range may
    meanwhile become the local end of any outgoing connection (a broker then fails to start, "Address already
    in use"); below it, only another server that bound the same port could take it."""
    low, high = _server_ports()
    draw = random.SystemRandom()
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            candidate = socket.socket()
            try:
                candidate.bind((host, draw.randint(low, high)))
            except OSError:  # in use (or lingering): draw again
                candidate.close()
                continue
            sockets.append(candidate)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _server_ports() -> tuple[int, int]:
    """The ports free_ports draws from: from 20000 up to the start of the ephemeral range."""
    try:
        ephemeral_start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_start = 32768  # Linux's default
    return (20000, ephemeral_start - 1) if ephemeral_start > 21000 else (ephemeral_start // 2, ephemeral_start - 1)


def new_cluster_id() -> str:
    """A random Kafka UUID in its base64 form; never one that starts with '-' (Kafka's own Uuid.randomUuid
    avoids those too: the storage tool would read it as an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def start(
    data_dir: Path | str,
    port: int | None = None,
    pid_file: Path | str | None = None,
    log_file: Path | str | None = None,
    timeout: float = 90.0,
    host: str = HOST,
    netns: str | None = None,
    listeners: dict[str, int] | None = None,
    settings: dict[str, str] | None = None,
    stack: str = STACK,
) -> Broker:
    """Start one KRaft node on `host` (127.0.0.1; a test host's address with `netns`, the network namespace
    that holds it: `ip netns exec` execs java, so the PID is still the broker's own). A directory that holds
    a node already is started again as it was (`port` must then be its port, or None)."""
    data_dir = Path(data_dir).resolve()
    if not (data_dir / CONFIG).exists():
        jars.jar_dir(stack)  # resolved (or refused) before the directory holds anything
        chosen = free_ports(2)
        port = port or chosen[0]
        voters = {1: (host, chosen[1] if netns is None else port + 1)}
        _configure(
            data_dir,
            1,
            host,
            port,
            voters,
            new_cluster_id(),
            replicas=1,
            listeners=listeners,
            extra=settings,
            stack=stack,
        )
        _format(data_dir, netns)
    node = _node(0, data_dir, host)
    if port is not None and port != node.port:
        raise KafkaError(f"the broker in {data_dir} listens on port {node.port}, not {port}")
    proc = _launch(data_dir, host, netns, log_file)
    node.pid = proc.pid
    if pid_file:
        Path(pid_file).write_text(f"{proc.pid}\n")
    _wait([proc], [node], expected=1, timeout=timeout)
    return node


def start_cluster(
    data_dir: Path | str,
    size: int = 3,
    timeout: float = 120.0,
    host: str = HOST,
    settings: dict[str, str] | None = None,
    stack: str = STACK,
) -> Cluster:
    """Start `size` KRaft nodes that are together broker and controller quorum, with replication factor
    `size` and `min.insync.replicas` size - 1 for every topic (internal ones too)."""
    data_dir = Path(data_dir).resolve()
    node_dirs = [data_dir / f"node-{i}" for i in range(1, size + 1)]
    if not (node_dirs[0] / CONFIG).exists():
        jars.jar_dir(stack)  # resolved (or refused) before the directories hold anything
        free = free_ports(2 * size)
        ports = {i: (free[2 * i - 2], free[2 * i - 1]) for i in range(1, size + 1)}
        voters = {i: (host, controller) for i, (_, controller) in ports.items()}
        cluster_id = new_cluster_id()
        for i, node_dir in enumerate(node_dirs, start=1):
            _configure(node_dir, i, host, ports[i][0], voters, cluster_id, replicas=size, extra=settings, stack=stack)
            _format(node_dir, None)
    procs = [_launch(d, host, None) for d in node_dirs]
    nodes = [_node(p.pid, d, host) for p, d in zip(procs, node_dirs)]
    try:
        _wait(procs, nodes, expected=size, timeout=timeout)
    except KafkaError:
        for p in procs:
            stop(p.pid)
        raise
    return Cluster(nodes, data_dir)


def _configure(
    node_dir: Path,
    node_id: int,
    host: str,
    port: int,
    voters: dict[int, tuple[str, int]],
    cluster_id: str,
    replicas: int,
    listeners: dict[str, int] | None = None,
    extra: dict[str, str] | None = None,
    stack: str = STACK,
) -> None:
    """Write the node's server.properties (and its log4j2 file and stack) once; a restart reads them again."""
    node_dir.mkdir(parents=True, exist_ok=True)
    controller_port = voters[node_id][1]
    named = {"PLAINTEXT": port, **(listeners or {})}
    bind = ",".join(f"{name}://{host}:{p}" for name, p in named.items())
    min_isr = str(max(1, replicas - 1))
    config = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "cluster.id.for.offsetlake": cluster_id,
        "controller.quorum.voters": ",".join(f"{i}@{h}:{p}" for i, (h, p) in voters.items()),
        "listeners": f"{bind},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": bind,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": ",".join(f"{name}:{_protocol(name)}" for name in [*named, "CONTROLLER"]),
        "log.dirs": str(node_dir / "data"),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
        "default.replication.factor": str(replicas),
        "min.insync.replicas": min_isr,
        **COMMON,
        **(extra or {}),
    }
    lines = [f"{k}={v}" for k, v in config.items() if k != "cluster.id.for.offsetlake"]
    (node_dir / CONFIG).write_text("\n".join(lines) + "\n")
    (node_dir / "cluster.id").write_text(cluster_id + "\n")
    (node_dir / "log4j2.properties").write_text(jvm.log4j2(node_dir / "broker.log", INFO_LOGGERS))
    (node_dir / STACK_FILE).write_text(stack + "\n")


def _protocol(listener: str) -> str:
    """A listener's security protocol: its name, as Kafka's own examples name them (SASL_PLAINTEXT, SSL)."""
    return "PLAINTEXT" if listener in ("PLAINTEXT", "CONTROLLER") else listener


def _properties(node_dir: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (node_dir / CONFIG).read_text().splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _node(pid: int, node_dir: Path, host: str) -> Broker:
    """The node a directory holds, read back from its server.properties."""
    config = _properties(node_dir)
    ports = {spec.split("://")[0]: int(spec.rsplit(":", 1)[1]) for spec in config["advertised.listeners"].split(",")}
    return Broker(pid, ports["PLAINTEXT"], node_dir, host, int(config["node.id"]), ports)


def _java(node_dir: Path) -> list[str]:
    stack_file = node_dir / STACK_FILE
    stack = stack_file.read_text().strip() if stack_file.exists() else STACK
    return jvm.command(stack, HEAP, node_dir / "log4j2.properties", "-Xms128m", "-XX:MaxGCPauseMillis=20")


def _format(node_dir: Path, netns: str | None) -> None:
    """Format the node's KRaft log directory (once, before its first start)."""
    cluster_id = (node_dir / "cluster.id").read_text().strip()
    prefix = ["ip", "netns", "exec", netns] if netns else []
    command = [*prefix, *_java(node_dir), STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(node_dir / CONFIG)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
        raise KafkaError(f"formatting the Kafka log directory {node_dir} failed: {last[0]}")


def _launch(node_dir: Path, host: str, netns: str | None, log_file: Path | str | None = None) -> subprocess.Popen:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    out = Path(log_file) if log_file else node_dir / "broker.out"
    with open(out, "ab") as log:
        return subprocess.Popen(
            [*prefix, *_java(node_dir), KAFKA_MAIN, str(node_dir / CONFIG)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _wait(procs: list[subprocess.Popen], nodes: list[Broker], expected: int, timeout: float) -> None:
    """Until each node answers a metadata request that lists `expected` brokers (registered and unfenced)."""
    deadline = time.monotonic() + timeout
    waiting = list(nodes)
    while waiting:
        for proc, node in zip(procs, nodes):
            if proc.poll() is not None:
                raise KafkaError(
                    f"Kafka node {node.node_id} exited with code {proc.returncode} on port {node.port}; "
                    f"see {node.data_dir / 'broker.log'}"
                )
        waiting = [n for n in waiting if _brokers_listed(n) < expected]
        if not waiting:
            return
        if time.monotonic() > deadline:
            for proc in procs:
                stop(proc.pid)
            node = waiting[0]
            raise KafkaError(
                f"Kafka did not answer on {node.bootstrap_servers} within {timeout:.0f}s; "
                f"see {node.data_dir / 'broker.log'}"
            )
        time.sleep(0.2)


def _brokers_listed(node: Broker) -> int:
    """How many brokers a metadata request to `node` lists (0: it does not answer yet)."""
    try:
        with socket.create_connection((node.host, node.port), timeout=0.5):
            pass
    except OSError:
        return 0
    from confluent_kafka.admin import AdminClient

    try:
        client = AdminClient({"bootstrap.servers": node.bootstrap_servers, "log_level": 0})
        return len(client.list_topics(timeout=2).brokers)
    except Exception:
        return 0


def stop(pid: int, timeout: float = 30.0) -> bool:
    """SIGTERM (a controlled shutdown), then SIGKILL if it will not go. True if it was running."""
    return processes.stop(pid, timeout)


def stop_from_pid_file(pid_file: Path | str) -> bool:
    return processes.stop_from_pid_file(Path(pid_file), MARKER, timeout=30.0)


def running_from_pid_file(pid_file: Path | str) -> int | None:
    pid = processes.read_pid(Path(pid_file))
    return pid if processes.runs(pid, MARKER) else None


PID_FILE = "broker.pids"  # the command line's record of the nodes it started, one PID per line


def main(argv: list[str] | None = None) -> None:
    """`start` a node or a cluster that outlives this command (its bootstrap servers printed, its PIDs kept in
    the directory), or `stop` the nodes a `start` on that directory recorded: a broker to point a benchmark's
    `--bootstrap` at, of the Kafka a POM names (`--stack kafka-broker-4.1`: another release)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m offsetlake_local.broker", description=main.__doc__)
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--data-dir", type=Path, required=True, help="the nodes' directory (created on start)")
    parser.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    parser.add_argument("--stack", default=STACK, help="the POM in offsetlake_local/poms of the broker's jars")
    args = parser.parse_args(argv)
    pid_file = args.data_dir / PID_FILE
    if args.action == "stop":
        pids = [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []
        processes.stop_all([pid for pid in pids if processes.runs(pid, MARKER)])
        pid_file.unlink(missing_ok=True)
        return
    if pid_file.exists():
        parser.error(f"{pid_file} exists: stop the nodes it names first")
    try:
        if args.nodes == 1:
            nodes = [start(args.data_dir, stack=args.stack)]
        else:
            nodes = start_cluster(args.data_dir, args.nodes, stack=args.stack).nodes
    except OffsetlakeError as err:  # no such POM, its jars unresolvable, a node that did not come up
        raise SystemExit(f"error: {err}") from err
    pid_file.write_text("".join(f"{n.pid}\n" for n in nodes))
    print(Cluster(nodes, args.data_dir).bootstrap_servers)


if __name__ == "__main__":
    main()
