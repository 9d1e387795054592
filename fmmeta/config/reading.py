"""Reading what the user wrote: a YAML file and ``section.key=value`` overrides, as one mapping.

Nothing here knows the schema; every problem found (a missing file, invalid YAML, a key written
twice, a malformed override) is appended to the caller's list, so it is reported together with
the schema's problems in one :class:`~fmmeta.config.errors.ConfigError`.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


def parse_overrides(overrides: Sequence[str], problems: list[str]) -> dict[str, Any]:
    """Turns ``["a.b=1", "c=x"]`` into a nested dict; values are parsed with ``yaml.safe_load``.

    Malformed overrides are appended to ``problems`` (not raised) so they are reported together
    with every other problem.
    """
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(
                f"override {item!r} is malformed: write section.key=value "
                "(e.g. train.meta_steps=10 or output_dir=runs/x)"
            )
            continue
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            problems.append(f"override {item!r}: the value is not valid YAML ({err})")
            continue
        parts = key.split(".")
        node = tree
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(
                    f"override {item!r} conflicts with an earlier override that set "
                    f"{'.'.join(parts[: depth + 1])} to a value"
                )
                break
            node = child
        else:
            node[parts[-1]] = value
    return tree


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that records every key written twice in one mapping.

    Why: PyYAML keeps the last of two equal keys without a word, so a file that sets
    ``meta_steps`` twice (or ``sampler:`` twice, dropping the first block) runs with whichever
    came last. ``duplicates`` collects them so they are reported with every other problem.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *anchor" merges a mapping; its keys may be overridden
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                self.duplicates.append(f"key {key!r} on line {line} repeats line {seen[key]}")
            elif isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _load_yaml(path: Path, problems: list[str]) -> Any:
    """Parses a YAML file; each key written twice in one mapping becomes a problem."""
    loader = _UniqueKeyLoader(path.read_text(encoding="utf-8"))
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    problems.extend(
        f"config file {str(path)!r}: {dup}: a key may appear once per section; delete one"
        for dup in loader.duplicates
    )
    return data


def read_config_file(path: Path, problems: list[str]) -> dict[str, Any]:
    """The mapping of sections a YAML config file holds; ``{}`` (and a problem) if it holds none."""
    try:
        loaded = _load_yaml(path, problems)
    except FileNotFoundError:
        problems.append(f"config file {str(path)!r} does not exist: check the --config path")
        loaded = None
    except yaml.YAMLError as err:
        problems.append(f"config file {str(path)!r} is not valid YAML: {err}")
        loaded = None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        problems.append(
            f"config file {str(path)!r} must hold a mapping of sections, got {type(loaded).__name__}"
        )
        return {}
    return loaded


def merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``update`` wins; nested mappings merge key by key."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(dict(out[key]), value)
        else:
            out[key] = value
    return out
