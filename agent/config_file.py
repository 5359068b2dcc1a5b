"""Reading the config file: the one YAML/JSON reader, and the agent's config from file and env.

The file is mounted from a ConfigMap and shared by the agents and the controller; what its
keys mean and how they are checked is agent/config.py (pure) and agent/controller/config.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from agent.config import AgentConfig, ConfigError, parse_config


def load_config(path: Path | None, *, node_name: str | None = None) -> AgentConfig:
    """Return the validated config from `path` (None: defaults); node name else $NODE_NAME."""
    raw: Mapping[str, Any] = {} if path is None else read_document(path)
    cfg = parse_config(raw)
    name = node_name or cfg.node_name or os.environ.get("NODE_NAME", "")
    return replace(cfg, node_name=name)


def read_document(path: Path) -> Mapping[str, Any]:
    """Return the parsed config file; ConfigError when it cannot be read or is not a mapping."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read configuration: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: the configuration must be a mapping")
    return raw
