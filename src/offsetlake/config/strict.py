"""What every settings model shares: no unknown keys, and secrets never printed."""

from __future__ import annotations

import re
import string
from typing import Any

from pydantic import BaseModel, ConfigDict

# Client settings whose values must never be printed.
SECRET_HINTS = ("password", "secret", "token", "sasl.oauthbearer.config", "ssl.key.pem", "credentials")


class Strict(BaseModel):
    # A field's docstring is its description: in `offsetlake schema` and the generated pipeline reference.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def path_placeholders(path: str) -> set[str]:
    """The `{...}` fields of a table path (`{{` and `}}` are literal braces): `{table}`, `{topic}`."""
    return {field for _, field, _, _ in string.Formatter().parse(path) if field is not None}


def redact_client(client: dict[str, Any]) -> dict[str, Any]:
    return {k: ("***" if any(h in k.lower() for h in SECRET_HINTS) else v) for k, v in client.items()}


def catalog_name(name: str | None) -> str | None:
    """A table's name in a catalog: `schema.table`, each part letters, digits, underscores or a placeholder."""
    parts = (name or "").split(".")
    if name is not None and (len(parts) != 2 or not all(re.fullmatch(r"(\w|\{table\}|\{topic\})+", p) for p in parts)):
        raise ValueError(
            f"{name!r}: a table name is schema.table, each of letters, digits and underscores (or {{table}})"
        )
    return name
