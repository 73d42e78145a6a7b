"""Configs written before the model's keys moved into sections, read as the sections they belong to.

The ``model`` section used to be one flat list (``model.k``, ``model.heads``, ``model.attention_gate``,
``model.coord_columns``, ...); those keys now live in ``model.attention`` and ``model.encoder``. A config
file, a ``--set`` override, a sweep or a run folder written before is read as before: each old key is
moved to its new place, and :func:`log_moved_keys` names the new keys in one line.

``model.attention: KIND`` (a name, not a mapping) is the short form of ``model.attention.kind: KIND``, not
an old key: it is read as such without a word.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["MOVED_KEYS", "SHORT_FORMS", "log_moved_keys", "moved_key", "upgrade_tree"]

logger = logging.getLogger("kmipgt.train.config")

# Dotted key before -> after.
MOVED_KEYS = {
    "model.coord_columns": "model.encoder.coord_columns",
    "model.num_frequencies": "model.encoder.num_frequencies",
    "model.pe_channels": "model.encoder.pe_channels",
    "model.rwse_norm": "model.encoder.rwse_norm",
    "model.attention_qk": "model.encoder.attention_qk",
    "model.k": "model.attention.k",
    "model.heads": "model.attention.heads",
    "model.head_dim": "model.attention.head_dim",
    "model.attn_dropout": "model.attention.dropout",
    "model.attention_gate": "model.attention.gate",
    "model.attention_drop_path": "model.attention.drop_path",
    "model.attention_order": "model.attention.order",
    "model.attention_layers": "model.attention.layers",
    "model.attention_options": "model.attention.options",
}
# A section given as a name instead of a mapping -> the key of the section the name sets.
SHORT_FORMS = {"model.attention": "kind"}


def moved_key(key: str, value: Any = None, moved: list[str] | None = None) -> str:
    """The dotted ``key`` of an override (of ``value``) as it is named now: an old key or a key inside an
    old one (``model.attention_options.backend``) moved to its section, a section given a name to the key
    the name sets; the old key is appended to ``moved``."""
    for old, new in MOVED_KEYS.items():
        if key == old or key.startswith(old + "."):
            if moved is not None:
                moved.append(old)
            return new + key[len(old):]
    if key in SHORT_FORMS and isinstance(value, str):
        return f"{key}.{SHORT_FORMS[key]}"
    return key


def _pop(tree: dict, key: str) -> tuple[bool, Any]:
    """Remove the dotted ``key`` from ``tree``: (whether it was there, its value)."""
    *sections, leaf = key.split(".")
    for part in sections:
        tree = tree.get(part) if isinstance(tree, dict) else None
    if not isinstance(tree, dict) or leaf not in tree:
        return False, None
    return True, tree.pop(leaf)


def _set(tree: dict, key: str, value: Any, old: str) -> None:
    """Set the dotted ``key`` (the new home of ``old``) in ``tree``, refusing a key set under both names."""
    *sections, leaf = key.split(".")
    for part in sections:
        tree = tree.setdefault(part, {})
    if leaf in tree:
        raise ValueError(f"config sets both {old!r} and {key!r}, the old and new name of one key; keep one")
    tree[leaf] = value


def upgrade_tree(tree: Any, moved: list[str] | None = None) -> Any:
    """A config tree (a parsed YAML mapping) with its old keys moved to their sections, in place, and
    section short forms expanded; the old keys found are appended to ``moved``. Anything but a mapping is
    returned as it is (the config check names what is wrong with it)."""
    if not isinstance(tree, dict):
        return tree
    for key, section_key in SHORT_FORMS.items():
        found, value = _pop(tree, key)
        if found:
            _set(tree, key, {section_key: value} if isinstance(value, str) else value, key)
    for old, new in MOVED_KEYS.items():
        found, value = _pop(tree, old)
        if found:
            _set(tree, new, value, old)
            if moved is not None:
                moved.append(old)
    return tree


def log_moved_keys(moved: list[str], source: str) -> None:
    """One warning naming the new key of each old key of ``source`` (a file, or the overrides)."""
    if moved:
        pairs = ", ".join(f"{old} -> {MOVED_KEYS[old]}" for old in dict.fromkeys(moved))
        logger.warning("%s uses config keys that moved into sections: %s (read as the new keys)",
                       source, pairs)
