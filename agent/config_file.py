"""Reading the config file: the one YAML/JSON reader, and the agent's config from file and env.

The file is mounted from a ConfigMap and shared by the agents and the controller; what its
keys mean and how they are checked is agent/config.py (pure) and agent/controller/config.py.
Everything that can go wrong reading it (missing, unreadable, too large, not YAML, empty, not
a mapping) is a ConfigError naming the file, never another exception.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from agent.config import AgentConfig, ConfigError, parse_config

# A ConfigMap holds at most 1 MiB; anything larger is not the file the operator meant.
MAX_BYTES = 1 << 20


def load_config(path: Path | None, *, node_name: str | None = None) -> AgentConfig:
    """Return the validated config from `path` (None: defaults); node name else $NODE_NAME."""
    raw: Mapping[str, Any] = {} if path is None else read_document(path)
    cfg = parse_config(raw)
    name = node_name or cfg.node_name or os.environ.get("NODE_NAME", "")
    return replace(cfg, node_name=name)


def read_bytes(path: Path) -> bytes:
    """Return the file's content; ConfigError when it cannot be read or is too large."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read configuration: {exc}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}: the configuration is larger than {MAX_BYTES} bytes")
    return data


def parse_document(data: bytes, where: Path | str) -> Mapping[str, Any]:
    """Return the parsed document; ConfigError when it is not YAML, empty, or not a mapping.

    An empty file (or one holding only comments, or `null`) is refused: a ConfigMap key
    mounted under the wrong name reads as empty, and nodelb would otherwise run on defaults
    without a word. `{}` says "every default" on purpose.
    """
    try:
        raw = yaml.safe_load(data)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # ValueError: a timestamp-looking value that is no date, an integer too long to read.
        raise ConfigError(f"{where}: not a YAML document: {exc}") from None
    if raw is None:
        raise ConfigError(
            f"{where}: the configuration is empty (write {{}} for every default, and "
            "`pools: []` for a controller with no pools)"
        )
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: the configuration must be a mapping, not {type(raw).__name__}")
    return raw


def read_document(path: Path) -> Mapping[str, Any]:
    """Return the parsed config file; ConfigError when it cannot be read or is not a mapping."""
    return parse_document(read_bytes(path), path)
