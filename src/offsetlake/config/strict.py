"""What every settings model shares: no unknown keys, and secrets never printed."""

from __future__ import annotations

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
