"""An embedded Schema Registry for tests and the demo: the REST endpoints confluent-kafka's client uses.

No Confluent or Karapace registry is installable from the package registries this
project can reach, so this serves what the client (serializers on the producing
side, offsetlake on the reading side) asks for, over real HTTP on 127.0.0.1:
registration (`POST /subjects/{s}/versions`), lookup (`POST /subjects/{s}`),
`GET /schemas/ids/{id}`, `GET /subjects[/{s}/versions[/{v}|latest]]` and
`/config`. Ids are global and a schema registered twice keeps its id, as in
Confluent's registry. Schemas are kept as registered (the Python Protobuf
serializer registers base64 descriptors, which is what offsetlake asks for with
`format=serialized`). No compatibility checks: the producer decides. Optional
basic auth. State lives in `<data-dir>/schemas.json`, so a restart keeps every id.

`--answer-as karapace` answers as Karapace 3.16 does, and as other Confluent-compatible
registries may: a Protobuf schema as `.proto` source even when asked for `format=serialized` (and, for
a schema with references, `format=serialized` refused with HTTP 500 "Internal server error"), Avro
schemas with their keys reordered, JSON Schemas with every `/` escaped. What is stored stays as
registered, so lookups by the producers' serializers match either way.

    python -m offsetlake_local.schema_registry --port 18081 --data-dir DIR [--user U --password-env VAR]
                                               [--answer-as confluent|karapace]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from offsetlake_local import processes

HOST = "127.0.0.1"


class Store:
    """Schemas by global id and subjects' versions, saved to a JSON file on every change."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        state = json.loads(path.read_text()) if path.is_file() else {"schemas": [], "subjects": {}}
        self.schemas: list[dict] = state["schemas"]  # index = id - 1: {schema, schemaType, references}
        self.subjects: dict[str, list[int]] = state["subjects"]  # subject -> ids of versions 1..n

    def register(self, subject: str, schema: dict) -> tuple[int, int]:
        with self.lock:
            entry = {
                "schema": schema["schema"],
                "schemaType": schema.get("schemaType", "AVRO"),
                "references": schema.get("references") or [],
            }
            schema_id = next((i + 1 for i, s in enumerate(self.schemas) if s == entry), None)
            if schema_id is None:
                self.schemas.append(entry)
                schema_id = len(self.schemas)
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            self._save()
            return schema_id, versions.index(schema_id) + 1

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"schemas": self.schemas, "subjects": self.subjects}))
        os.replace(tmp, self.path)

    def by_id(self, schema_id: int) -> dict | None:
        return self.schemas[schema_id - 1] if 0 < schema_id <= len(self.schemas) else None

    def version(self, subject: str, version: str) -> dict | None:
        versions = self.subjects.get(subject)
        if not versions:
            return None
        number = len(versions) if version in ("latest", "-1") else int(version)
        if not 0 < number <= len(versions):
            return None
        schema_id = versions[number - 1]
        return {"subject": subject, "version": number, "id": schema_id, **(self.by_id(schema_id) or {})}


ANSWERS = ("confluent", "karapace")


def as_karapace(entry: dict) -> dict:
    """A stored schema as Karapace answers it (see the module docstring)."""
    kind, text = entry["schemaType"], entry["schema"]
    if kind == "PROTOBUF":
        from google.protobuf import descriptor_pb2

        from offsetlake_local.proto_text import proto_text

        try:
            descriptor = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
        except Exception:  # registered as source already
            return entry
        return {**entry, "schema": proto_text(descriptor)}
    if kind == "JSON":
        return {**entry, "schema": json.dumps(json.loads(text)).replace("/", "\\/")}
    return {**entry, "schema": json.dumps(_reordered(json.loads(text)))}


def _reordered(node):
    """Every object's keys sorted (Karapace's own order differs from the registered one)."""
    if isinstance(node, dict):
        return {k: _reordered(node[k]) for k in sorted(node)}
    if isinstance(node, list):
        return [_reordered(n) for n in node]
    return node


def karapace_refuses(entry: dict, query: str) -> bool:
    """Karapace 3.16 answers `format=serialized` for a Protobuf schema with references with HTTP 500."""
    return (
        entry.get("schemaType") == "PROTOBUF"
        and bool(entry.get("references"))
        and "serialized" in (parse_qs(query).get("format") or [])
    )


def handler_for(store: Store, credentials: str | None, answer_as: str = "confluent"):
    karapace = answer_as == "karapace"
    shown = as_karapace if karapace else (lambda entry: entry)
    expected = "Basic " + base64.b64encode(credentials.encode()).decode() if credentials else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: tests read their own output
            pass

        def _reply(self, status: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refused(self, entry: dict) -> bool:
            if karapace and karapace_refuses(entry, urlsplit(self.path).query):
                self._reply(500, {"error_code": 500, "message": "Internal server error"})
                return True
            return False

        def _not_found(self, code: int, message: str) -> None:
            self._reply(404, {"error_code": code, "message": message})

        def _authorised(self) -> bool:
            if expected is None or self.headers.get("Authorization") == expected:
                return True
            self._reply(401, {"error_code": 401, "message": "Unauthorized"})
            return False

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def do_GET(self):
            if not self._authorised():
                return
            path = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            if path[:2] == ["schemas", "ids"] and len(path) >= 3 and path[2].isdigit():
                found = store.by_id(int(path[2]))
                if found is None:
                    return self._not_found(40403, f"Schema {path[2]} not found")
                if self._refused(found):
                    return None
                found = shown(found)
                if len(path) == 4 and path[3] == "schema":
                    return self._reply(
                        200, json.loads(found["schema"]) if found["schemaType"] != "PROTOBUF" else found["schema"]
                    )
                return self._reply(200, {"id": int(path[2]), **found})
            if path == ["subjects"]:
                return self._reply(200, sorted(store.subjects))
            if path[0] == "subjects" and len(path) >= 3 and path[2] == "versions":
                if len(path) == 3:
                    if path[1] not in store.subjects:
                        return self._not_found(40401, f"Subject '{path[1]}' not found.")
                    return self._reply(200, list(range(1, len(store.subjects[path[1]]) + 1)))
                found = store.version(path[1], path[3])
                if found is None:
                    return self._not_found(
                        40401 if path[1] not in store.subjects else 40402,
                        f"Subject '{path[1]}' or version {path[3]} not found.",
                    )
                if self._refused(found):
                    return None
                return self._reply(200, shown(found))
            if path[0] == "config":
                return self._reply(200, {"compatibilityLevel": "BACKWARD"})
            self._not_found(404, f"no such endpoint: {self.path}")

        def do_POST(self):
            if not self._authorised():
                return
            path = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            body = self._body()
            if path[0] == "subjects" and len(path) == 3 and path[2] == "versions":
                schema_id, version = store.register(path[1], body)
                return self._reply(200, {"id": schema_id, "version": version, "subject": path[1], **body})
            if path[0] == "subjects" and len(path) == 2:
                entry = {
                    "schema": body["schema"],
                    "schemaType": body.get("schemaType", "AVRO"),
                    "references": body.get("references") or [],
                }
                for number, schema_id in enumerate(store.subjects.get(path[1], []), 1):
                    if store.by_id(schema_id) == entry:
                        return self._reply(200, {"subject": path[1], "version": number, "id": schema_id, **entry})
                return self._not_found(40403, "Schema not found")
            self._not_found(404, f"no such endpoint: {self.path}")

    return Handler


def serve(port: int, data_dir: Path, credentials: str | None, host: str = HOST, answer_as: str = "confluent") -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer((host, port), handler_for(Store(data_dir / "schemas.json"), credentials, answer_as))
    server.daemon_threads = True
    server.serve_forever()


@dataclass
class SchemaRegistry:
    pid: int
    port: int
    host: str = HOST

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def start(
    data_dir: Path | str,
    port: int | None = None,
    user: str | None = None,
    password: str | None = None,
    pid_file: Path | str | None = None,
    timeout: float = 30.0,
    answer_as: str = "confluent",
) -> SchemaRegistry:
    """Start the registry as its own process (stopped by PID); returns when it answers. `answer_as`:
    "confluent", or "karapace" to answer as Karapace does (the module docstring)."""
    from offsetlake_local.broker import free_port

    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = dict(os.environ)
    args = [
        sys.executable,
        "-m",
        "offsetlake_local.schema_registry",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--answer-as",
        answer_as,
    ]
    if user is not None:
        env["OFFSETLAKE_REGISTRY_PASSWORD"] = password or ""
        args += ["--user", user, "--password-env", "OFFSETLAKE_REGISTRY_PASSWORD"]
    with open(data_dir / "registry.log", "ab") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
    if pid_file:
        Path(pid_file).write_text(f"{proc.pid}\n")
    registry = SchemaRegistry(proc.pid, port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the schema registry exited with code {proc.returncode}; see {data_dir}/registry.log")
        try:
            urllib.request.urlopen(f"{registry.url}/config", timeout=1)
            return registry
        except urllib.error.HTTPError:  # 401 with auth: it answers
            return registry
        except OSError:
            time.sleep(0.1)
    stop(proc.pid)
    raise RuntimeError(f"the schema registry did not answer on port {port} within {timeout:.0f}s")


def stop(pid: int, timeout: float = 10.0) -> None:
    processes.stop(pid, timeout=timeout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--user")
    parser.add_argument("--password-env", help="environment variable holding the basic-auth password")
    parser.add_argument(
        "--answer-as",
        choices=ANSWERS,
        default="confluent",
        help="answer as Confluent's registry does, or as Karapace does (Protobuf as .proto source, ...)",
    )
    args = parser.parse_args(argv)
    credentials = f"{args.user}:{os.environ.get(args.password_env or '', '')}" if args.user else None
    serve(args.port, args.data_dir, credentials, answer_as=args.answer_as)


if __name__ == "__main__":
    main()
