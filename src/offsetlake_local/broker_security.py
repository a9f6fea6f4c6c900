"""Security an embedded broker enforces: SASL/SCRAM-SHA-512 and mutual-TLS listeners, with ACLs.

`start_secured(dir)` starts one KRaft node (offsetlake_local.broker) with three listeners:

- `PLAINTEXT`: the harness's own (topics, users, ACLs); its principal (User:ANONYMOUS) is a super user, so
  it must never be what a pipeline under test connects to;
- `SASL_PLAINTEXT`: SCRAM-SHA-512 logins, checked against the credentials `add_user` stored in the cluster
  metadata (a wrong password is refused);
- `SSL`: TLS with client certificates (`ssl.client.auth=required`) issued by this module's own CA; the
  principal is the certificate's CN (`ssl.principal.mapping.rules`).

Kafka's StandardAuthorizer checks every request; a principal may do only what `allow` granted
(`allow.everyone.if.no.acl.found` stays false). Certificates are PEM files (Kafka reads PEM key and trust
stores; librdkafka takes the same files), made with `cryptography`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from offsetlake_local import broker

SCRAM = "SCRAM-SHA-512"


@dataclass
class SecuredBroker:
    node: broker.Broker
    certs: Path  # ca.pem, and <name>.pem / <name>.key per certificate issued

    @property
    def pid(self) -> int:
        return self.node.pid

    @property
    def admin_bootstrap(self) -> str:
        """The PLAINTEXT listener: a super user's, for the harness only."""
        return self.node.bootstrap_servers

    @property
    def sasl_bootstrap(self) -> str:
        return f"{self.node.host}:{self.node.listeners['SASL_PLAINTEXT']}"

    @property
    def ssl_bootstrap(self) -> str:
        return f"{self.node.host}:{self.node.listeners['SSL']}"

    def sasl_client(self, user: str, password: str) -> dict[str, str]:
        """librdkafka settings for a SCRAM login as `user`."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": SCRAM,
            "sasl.username": user,
            "sasl.password": password,
        }

    def ssl_client(self, name: str) -> dict[str, str]:
        """librdkafka settings for a TLS client whose certificate names `name` (issued on first use)."""
        cert, key = issue(self.certs, name)
        return {
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.certs / "ca.pem"),
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
            "ssl.endpoint.identification.algorithm": "none",
        }


def start_secured(data_dir: Path | str, pid_file: Path | str | None = None) -> SecuredBroker:
    data_dir = Path(data_dir).resolve()
    certs = data_dir / "certs"
    listeners = None  # a node started again keeps the listeners its configuration names
    if not (data_dir / broker.CONFIG).exists():
        sasl_port, ssl_port = broker.free_ports(2)
        listeners = {"SASL_PLAINTEXT": sasl_port, "SSL": ssl_port}
        certs.mkdir(parents=True, exist_ok=True)
        _make_ca(certs)
        server_cert, server_key = issue(certs, "broker", server=True)
        (certs / "broker-keystore.pem").write_bytes(server_key.read_bytes() + server_cert.read_bytes())
    settings = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
        "sasl.enabled.mechanisms": SCRAM,
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": SCRAM,
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "listener.name.ssl.ssl.client.auth": "required",
        "listener.name.ssl.ssl.keystore.type": "PEM",
        "listener.name.ssl.ssl.keystore.location": str(certs / "broker-keystore.pem"),
        "listener.name.ssl.ssl.truststore.type": "PEM",
        "listener.name.ssl.ssl.truststore.location": str(certs / "ca.pem"),
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
    }
    node = broker.start(data_dir, pid_file=pid_file, listeners=listeners, settings=settings)
    return SecuredBroker(node, certs)


def add_user(secured: SecuredBroker, user: str, password: str) -> None:
    """Store SCRAM-SHA-512 credentials for `user` (a new password replaces the old)."""
    admin = AdminClient({"bootstrap.servers": secured.admin_bootstrap})
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result()


def allow(secured: SecuredBroker, principal: str, resource: str, name: str, *operations: str) -> None:
    """Grant User:`principal` `operations` (READ, DESCRIBE, ...) on a topic or group (`resource`), by
    exact name or, with a name ending in '*', by prefix."""
    kind = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}[resource]
    pattern = ResourcePatternType.PREFIXED if name.endswith("*") else ResourcePatternType.LITERAL
    bindings = [
        AclBinding(kind, name.rstrip("*"), pattern, f"User:{principal}", "*", AclOperation[op], AclPermissionType.ALLOW)
        for op in operations
    ]
    admin = AdminClient({"bootstrap.servers": secured.admin_bootstrap})
    for future in admin.create_acls(bindings).values():
        future.result()


# -- certificates ---------------------------------------------------------------------------------------


def _make_ca(certs: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "offsetlake test CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    (certs / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (certs / "ca.key").write_bytes(_pkcs8(key))


def issue(certs: Path, name: str, server: bool = False) -> tuple[Path, Path]:
    """A certificate for CN=`name` signed by the CA in `certs` (made once); returns (cert, key) paths."""
    cert_path, key_path = certs / f"{name}.pem", certs / f"{name}.key"
    if cert_path.exists():
        return cert_path, key_path
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
    )
    if server:
        import ipaddress

        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(broker.HOST))]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_pkcs8(key))
    return cert_path, key_path


def _pkcs8(key) -> bytes:
    """Unencrypted PKCS#8 PEM: what Kafka's PEM key store reads without ssl.key.password."""
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
