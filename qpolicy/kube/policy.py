"""Per-GPU policies from the policy ConfigMap (``--policy-configmap NAMESPACE/NAME``).

A node uses the key its label ``qpolicy.io/config`` names, else ``default`` (a label naming no key
falls back to ``default`` too). Each value is YAML, the ``gpus`` part of the daemon's state file::

    gpus:
      "0": {policy: burst-share, period_ms: 50}

and is checked by the state file's own parsers (:func:`qpolicy.state.decode_state`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from qpolicy.errors import StateError, ValidationError
from qpolicy.model import GpuConfig
from qpolicy.state import SCHEMA_VERSION, decode_state

NODE_LABEL = "qpolicy.io/config"
DEFAULT_KEY = "default"


def parse_configmap_ref(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` of a ConfigMap."""
    namespace, sep, name = text.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValidationError(
            f"invalid ConfigMap {text!r}: expected NAMESPACE/NAME, e.g. "
            "qpolicy-system/qpolicy-policy"
        )
    return namespace, name


def config_key(data: Mapping[str, str], node_labels: Mapping[str, str]) -> str:
    """The key of ``data`` this node uses."""
    wanted = node_labels.get(NODE_LABEL)
    if wanted is not None and wanted in data:
        return wanted
    return DEFAULT_KEY


def parse_policy(text: str, where: str) -> dict[int, GpuConfig]:
    """One value of the ConfigMap; StateError names ``where`` and what is wrong."""
    try:
        value: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise StateError(f"{where}: not YAML: {' '.join(str(error).split())}") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise StateError(f"{where}: {error}") from None
    except RecursionError:  # "[[[[..." nested deeper than the parser's recursion
        raise StateError(f"{where}: nested too deeply") from None
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) != {"gpus"}:
        keys = sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__
        raise StateError(f"{where}: expected a mapping with the one key 'gpus', found {keys}")
    gpus = value["gpus"]
    if isinstance(gpus, dict):
        # YAML reads an unquoted 0: as an integer key; the state file's keys are strings.
        gpus = {str(k) if isinstance(k, int) else k: v for k, v in gpus.items()}
    document = {"schema": SCHEMA_VERSION, "gpus": gpus, "pods": {}}
    try:
        raw = json.dumps(document).encode()
    except (TypeError, ValueError) as error:
        raise StateError(f"{where}: {error}") from None
    return dict(decode_state(raw, where).gpus)
