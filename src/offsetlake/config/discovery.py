"""Finding and loading pipeline files: one YAML file per pipeline under include/pipelines/.

`${VAR}` / `${VAR:-default}` references are resolved from the environment at load time so secrets never
live in the file; validation errors are flattened to one line because they reach a terminal or an Airflow
task log.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from offsetlake.config.model import NAME_RE, PipelineConfig, TableSettings
from offsetlake.errors import ConfigError

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env(value: Any, where: str = "") -> Any:
    """Replace ${VAR} and ${VAR:-default} in every string of a YAML document."""
    if isinstance(value, dict):
        return {k: resolve_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        var, default = match.group(1), match.group(2)
        if var in os.environ:
            return os.environ[var]
        if default is not None:
            return str(default)
        raise ConfigError(f"key {where!r} refers to environment variable {var} which is not set")

    return ENV_REF.sub(substitute, value)


def _error_line(source: str, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {loc!r}"
    if first["type"] == "missing":
        return f"{source}: missing required key {loc!r}"
    msg = first["msg"].removeprefix("Value error, ")
    return f"{source}: key {loc!r}: {msg}"


def parse_pipeline(raw: Any, source: str, base_dir: Path | None = None) -> PipelineConfig:
    """Validate a loaded YAML document. Relative table paths resolve against base_dir."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of settings at the top level")
    resolved = resolve_env(raw)
    try:
        cfg = PipelineConfig.model_validate(resolved)
    except ValidationError as err:
        raise ConfigError(_error_line(source, err)) from err
    if base_dir is not None:
        cfg = _absolute_paths(cfg, base_dir)
    return cfg


def _absolute_paths(cfg: PipelineConfig, base_dir: Path) -> PipelineConfig:
    def absolute(t: TableSettings | None) -> TableSettings | None:
        if t is None or "://" in t.path or os.path.isabs(t.path):
            return t
        return t.model_copy(update={"path": str((base_dir / t.path).resolve())})

    update: dict[str, Any] = {"table": absolute(cfg.table), "quarantine": absolute(cfg.quarantine)}
    schema_file = cfg.format.schema_file
    if schema_file and not os.path.isabs(schema_file):
        update["format"] = cfg.format.model_copy(update={"schema_file": str((base_dir / schema_file).resolve())})
    return cfg.model_copy(update=update)


def project_home() -> Path:
    return Path(os.environ.get("OFFSETLAKE_HOME", os.getcwd())).resolve()


def pipelines_dir() -> Path:
    return Path(os.environ.get("OFFSETLAKE_PIPELINES_DIR", project_home() / "include" / "pipelines"))


def load_pipeline(name: str, directory: Path | str | None = None) -> PipelineConfig:
    """Load `include/pipelines/<name>.yaml` (or `<directory>/<name>.yaml`)."""
    if not re.match(NAME_RE, name or ""):
        raise ConfigError(f"invalid pipeline name {name!r}: use letters, digits, '_' and '-'")
    directory = Path(directory) if directory else pipelines_dir()
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(list_pipelines(directory)) or "none"
        raise ConfigError(f"unknown pipeline {name!r}: no {path} (known: {known})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from err
    cfg = parse_pipeline(raw, str(path), base_dir=project_home())
    if cfg.name != name:
        raise ConfigError(f"{path}: key 'name' is {cfg.name!r} but the file is named {name!r}")
    return cfg


def list_pipelines(directory: Path | str | None = None) -> list[str]:
    directory = Path(directory) if directory else pipelines_dir()
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
