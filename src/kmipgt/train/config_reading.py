"""How a config file is read: YAML with the safe loader (aliases refused), ``key.sub=value`` overrides,
and typed sections built from mappings, naming unknown keys and values of the wrong type."""

from __future__ import annotations

import dataclasses
import difflib
import reprlib
import types
import typing
from typing import Any

import yaml

__all__ = ["build_section", "parse_override", "read_yaml"]


def _checked(value: Any, annotation: Any, key: str) -> Any:
    """``value`` for config key ``key``: a section built from its mapping, or a value of the key's type."""
    if dataclasses.is_dataclass(annotation):
        return build_section(annotation, value, key)
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    options = typing.get_args(annotation) if union else (annotation,)
    allowed = tuple(typing.get_origin(a) or a for a in options)  # list[int] | None -> (list, NoneType)
    if float in allowed and type(value) is int:  # YAML reads ``lr: 1`` as an int
        return float(value)
    # bool is a subclass of int, but ``k: true`` is a mistake rather than k = 1
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise TypeError(f"config key {key!r} expects {_type_name(annotation)}, got {reprlib.repr(value)}")
    return value


def _type_name(annotation: Any) -> str:
    """``int``, ``int | None``, ``list[int]``: the annotation as it is written, not ``<class 'int'>``."""
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _unknown_key_message(unknown: list[str], known: list[str], where: str) -> str:
    """Name the unknown keys, each with the closest known key where one is close (a typo); the known keys
    are listed only where some unknown key has no close match."""
    close = {key: difflib.get_close_matches(key, known, n=1) for key in unknown}
    named = ", ".join(
        f"{reprlib.repr(key)} (did you mean {match[0]!r}?)" if match else reprlib.repr(key)
        for key, match in close.items()
    )
    listed = "" if all(close.values()) else f"; known: {', '.join(known)}"
    return f"unknown config keys in {where!r}: {named}{listed}"


def build_section(cls: type, values: Any, section: str = "") -> Any:
    """An instance of the dataclass ``cls`` from a mapping that may leave keys out but adds none."""
    where = section or "<root>"
    if not isinstance(values, dict):
        raise TypeError(f"config section {where!r} must be a mapping, got {reprlib.repr(values)}")
    fields = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(_unknown_key_message(unknown, sorted(fields), where))
    prefix = f"{section}." if section else ""
    return cls(**{key: _checked(value, fields[key], prefix + key) for key, value in values.items()})


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``): a few hundred bytes of nested aliases expand to
    gigabytes, and no config needs them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found the alias *{event.anchor} (aliases are not read)", event.start_mark
            )
        return super().compose_node(parent, index)


def read_yaml(stream: Any, source: str) -> Any:
    """Parse YAML text or a file with the safe loader, aliases refused; a syntax error or an alias becomes a
    one-line ValueError naming ``source``."""
    try:
        return yaml.load(stream, Loader=_NoAliasLoader)
    except yaml.YAMLError as error:
        raise ValueError(f"{source} is not valid YAML: {' '.join(str(error).split())}") from error


def parse_override(text: str) -> tuple[str, Any]:
    """``"model.channels=32"`` -> ``("model.channels", 32)``: the value is read as YAML (numbers, lists,
    null, ...)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override must look like key.sub=value, got {text!r}")
    return key.strip(), read_yaml(raw, f"override {text!r}")
