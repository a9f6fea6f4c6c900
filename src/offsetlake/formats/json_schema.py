"""JSON Schema through a Schema Registry: the Arrow type a schema maps to (its `$ref`s resolved, local or to
another subject's schema through the registry's references) and a strict check of each value against it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin

import pyarrow as pa

from offsetlake.formats.registry_client import UnusableSchema
from offsetlake.formats.schema_decoder import TIMESTAMP, SchemaDecoder


class JsonSchemaDecoder(SchemaDecoder):
    """JSON text checked against the Arrow type the JSON Schema maps to (types strictly, as format json)."""

    kind_name = "JSON"

    def __init__(self, schema: dict, documents: dict[str, dict] | None = None):
        self.arrow_type = json_schema_to_arrow(schema, schema, set(), documents)
        self._convert = _json_converter(self.arrow_type)

    def decode(self, payload: bytes) -> Any:
        try:
            value = json.loads(payload)
        except UnicodeDecodeError as err:
            raise ValueError("value is not UTF-8") from err
        return self._convert(value, "value")


def referenced_documents(registry, schema, documents: dict[str, dict] | None = None) -> dict[str, dict]:
    """Every schema `schema` references (other subjects' versions, as the registry lists them), by the
    reference's name, read through `registry` recursively: what a `$ref` to another file points at."""
    documents = {} if documents is None else documents
    for ref in schema.references or []:
        if ref.name in documents:
            continue  # two schemas sharing one reference read it once
        referenced = registry.version(ref.subject, ref.version).schema
        try:
            documents[ref.name] = json.loads(referenced.schema_str)
        except ValueError as err:
            raise UnusableSchema(f"the JSON Schema referenced as {ref.name!r} is not JSON") from err
        referenced_documents(registry, referenced, documents)
    return documents


def json_schema_to_arrow(
    node: dict, root: dict, refs: set[str], documents: dict[str, dict] | None = None, base: str | None = None
) -> pa.DataType:
    """The Arrow type of a JSON Schema `node` inside the document `root`. `refs`: the `$ref`s followed to
    get here (a recursive one cannot be a column type); `documents`: the referenced schemas by name
    (`referenced_documents`); `base`: the URI `root` is known by (its `$id`), against which refs resolve."""
    documents = documents or {}
    base = root.get("$id", "") if base is None else base
    if "$ref" in node:
        target_root, target, key, target_base = _resolve(node["$ref"], root, base, documents)
        if key in refs:
            raise UnusableSchema(f"JSON Schema $ref {node['$ref']!r} is recursive, which a Delta column cannot be")
        return json_schema_to_arrow(target, target_root, refs | {key}, documents, target_base)

    def inner(child: dict) -> pa.DataType:
        return json_schema_to_arrow(child, root, refs, documents, base)

    for combinator in ("oneOf", "anyOf"):
        if combinator in node:
            branches = [b for b in node[combinator] if b.get("type") != "null"]
            if len(branches) != 1:
                raise UnusableSchema(
                    f"JSON Schema {combinator} with several non-null branches cannot be one Delta column"
                )
            return inner(branches[0])
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise UnusableSchema(
                f"JSON Schema type {kind} has several non-null types, which a Delta column cannot hold"
            )
        kind = kinds[0]
    if kind == "object":
        props = node.get("properties")
        if not props and isinstance(node.get("additionalProperties"), dict):
            return pa.map_(pa.string(), inner(node["additionalProperties"]))
        return pa.struct([pa.field(k, inner(v)) for k, v in (props or {}).items()])
    if kind == "array":
        return pa.list_(inner(node.get("items", {"type": "string"})))
    if kind == "string":
        return {"date-time": TIMESTAMP, "date": pa.date32(), "byte": pa.binary()}.get(
            node.get("format", ""), pa.string()
        )
    if kind == "integer":
        return pa.int64()
    if kind == "number":
        return pa.float64()
    if kind == "boolean":
        return pa.bool_()
    raise UnusableSchema(f"JSON Schema type {kind!r} has no Delta column type (give each property a type)")


def _resolve(ref: str, root: dict, base: str, documents: dict[str, dict]) -> tuple[dict, Any, str, str]:
    """(document, node, the ref's absolute form, the document's base) for a `$ref`: a JSON pointer in the
    same document (`#/definitions/x`), or into a referenced one (`address.json#/definitions/street`,
    `https://example.com/address.json`), found by its reference name or its `$id`."""
    uri, _, fragment = urljoin(base, ref).partition("#")
    if uri in ("", base.partition("#")[0]):
        document, document_base = root, base
    else:
        found = [doc for name, doc in documents.items() if uri in (name, doc.get("$id"), urljoin(base, name))]
        if not found:
            raise UnusableSchema(
                f"JSON Schema $ref {ref!r} names a schema the registry does not list among the schema's references"
            )
        document, document_base = found[0], uri
    node: Any = document
    for part in [p for p in fragment.split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")  # JSON pointer escapes
        if not isinstance(node, dict) or part not in node:
            raise UnusableSchema(f"JSON Schema $ref {ref!r} points at nothing in its schema")
        node = node[part]
    if not isinstance(node, dict):
        raise UnusableSchema(f"JSON Schema $ref {ref!r} points at no schema")
    return document, node, f"{uri}#{fragment}", document_base


def _json_converter(t: pa.DataType) -> Callable[[Any, str], Any]:
    """A function checking (and converting, for dates and times) a decoded JSON value against `t`."""
    from offsetlake.formats.values import coerce  # the json format's strict coercions, one definition

    if pa.types.is_struct(t):
        fields = [(t.field(i).name, _json_converter(t.field(i).type)) for i in range(t.num_fields)]

        def struct(value, where):
            if value is None:
                return None
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
            return {name: convert(value.get(name), f"{where}.{name}") for name, convert in fields}

        return struct
    if pa.types.is_list(t):
        item = _json_converter(t.value_type)

        def array(value, where):
            if value is None:
                return None
            if not isinstance(value, list):
                raise ValueError(f"{where}: expected an array, got {type(value).__name__}")
            return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

        return array
    if pa.types.is_map(t):
        item = _json_converter(t.item_type)

        def mapping(value, where):
            if value is None:
                return None
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
            return [(k, item(v, f"{where}.{k}")) for k, v in value.items()]

        return mapping
    name = {
        pa.string(): "string",
        pa.int64(): "long",
        pa.float64(): "double",
        pa.bool_(): "boolean",
        TIMESTAMP: "timestamp",
        pa.date32(): "date",
        pa.binary(): "binary",
    }[t]

    def scalar(value, where):
        if value is None:
            return None
        try:
            return coerce(value, name)
        except (TypeError, ValueError, OverflowError) as err:
            raise ValueError(f"{where}: {err}") from err

    return scalar
