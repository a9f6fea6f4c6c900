"""A Confluent-compatible Schema Registry as offsetlake talks to it: confluent-kafka's client, with two
kinds of failure kept apart (see `formats.registry`): `RegistryError` (unreachable, refusing: the batch
fails in one line) and `UnusableSchema` (the records that use the schema are quarantined)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from offsetlake.config import RegistrySettings
from offsetlake.errors import RegistryError


class UnusableSchema(Exception):
    """Records written with this schema cannot go to the table (the reason is their quarantine error)."""


class RegistryRefused(RegistryError):
    """The registry answered a request with an HTTP error other than "not found" (a 5xx, a 4xx): the same
    schema may still be had in another form (Protobuf: the text form, see `protobuf.fetch_schema`)."""

    code = "registry-refused"


def redacted_url(url: str) -> str:
    """The URL without any user:password@ part, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=f"***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")))


class Registry:
    """confluent-kafka's SchemaRegistryClient with offsetlake's errors: one per settings per process."""

    def __init__(self, settings: RegistrySettings):
        from confluent_kafka.schema_registry import SchemaRegistryClient

        conf: dict[str, Any] = {
            "url": settings.url,
            "timeout": settings.timeout_seconds,
            "max.retries": 2,
            "retries.wait.ms": 200,
            "retries.max.wait.ms": 1000,
        }
        # The config's validators (and config/connections.py, for a connection) give both or neither, and a URL.
        assert settings.url is not None
        if settings.username is not None and settings.password is not None:
            conf["basic.auth.user.info"] = (
                f"{settings.username.get_secret_value()}:{settings.password.get_secret_value()}"
            )
        self.url = redacted_url(settings.url)
        self._client = SchemaRegistryClient(conf)

    def schema_by_id(self, schema_id: int | None, guid=None, fmt: str | None = None):
        """The schema behind an id (or GUID); UnusableSchema when the registry has none."""
        what = f"schema id {schema_id}" if guid is None else f"schema GUID {guid}"
        if guid is not None:
            return self._call(lambda: self._client.get_schema_by_guid(str(guid), fmt=fmt), what, unknown=True)
        assert schema_id is not None, "a schema id or a GUID"
        return self._call(lambda: self._client.get_schema(schema_id, fmt=fmt), what, unknown=True)

    def latest(self, subject: str, fmt: str | None = None):
        """The subject's latest registered schema (the table is created from it)."""
        return self._call(lambda: self._client.get_latest_version(subject, fmt=fmt), f"subject {subject!r}")

    def check(self) -> None:
        """Answer or raise RegistryError: asked before a job starts Spark, so an outage costs a second."""
        self._call(self._client.get_subjects, "its subjects")

    def version(self, subject: str, version: int, fmt: str | None = None):
        return self._call(
            lambda: self._client.get_version(subject, version, fmt=fmt), f"subject {subject!r} version {version}"
        )

    def _call(self, request: Callable, what: str, unknown: bool = False):
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return request()
        except SchemaRegistryError as err:
            if err.http_status_code == 404:
                if unknown:  # the caller names the schema
                    raise UnusableSchema(f"unknown to the Schema Registry at {self.url}") from err
                raise RegistryError(f"Schema Registry at {self.url}: {what} not found") from err
            status, message = err.http_status_code, shortened(err.error_message)
            raise RegistryRefused(f"Schema Registry at {self.url} refused {what}: HTTP {status} {message}") from err
        except Exception as err:  # httpx transport errors, timeouts: the registry is away
            raise RegistryError(
                f"Schema Registry at {self.url} is unreachable ({type(err).__name__}: "
                f"{shortened(str(err))}) while fetching {what}; nothing was committed"
            ) from err


def shortened(text: str) -> str:
    """One line of at most 200 characters, for messages."""
    return " ".join(str(text).split())[:200]


@functools.lru_cache(maxsize=8)
def registry_for(settings: RegistrySettings) -> Registry:
    return Registry(settings)
