"""Typed configuration: keyword-only dataclasses are the one source of defaults.

A run's configuration is a tree of keyword-only dataclasses (one per section). YAML files hold
only what differs from the defaults, and ``section.key=value`` command-line overrides come last.
:func:`load_config` merges the three, checks every key and type against the schema, runs each
section's validation and raises one :class:`ConfigError` listing *every* problem, so a user fixes
a config in one round trip instead of one error per launch (litgpt, accelerate do the same).

The machinery is generic: any nested keyword-only dataclass works as a schema, with fields typed
as ``bool``, ``int``, ``float``, ``str``, ``Path``, ``Literal[...]``, ``X | None``, ``tuple[...]``,
``list[...]``, ``dict[str, ...]`` or another dataclass. Every section works the same way:

* each field is documented by the string literal under it (an attribute docstring), which is
  what ``--help`` prints (:func:`describe_config`);
* a section validates itself in one ``validate() -> list[str]`` method, one problem per string,
  each starting with the field name (``"keep_last=1 is invalid ..."``); the loader prepends the
  section's dotted path (``"train.keep_last=1 is invalid ..."``). Constructing a section never
  raises, so the loader can report every problem of every section at once; code that receives a
  section built without the loader calls :func:`raise_if_invalid`.

A value that a run derives from other keys is not a field: a key a user can set must do what it
says (``tests/unit/config/test_schema.py`` walks the whole recipe schema to check it).

The package has one module per job: ``reading`` (the YAML file and the overrides), ``schema``
(the schema's types and defaults), ``loader`` (types checked, sections built and validated),
``describe`` (the ``--help`` text), ``errors`` and ``sections`` (the sections no other layer owns:
:class:`ModelConfig`, :class:`LoraConfig`, :class:`TrainConfig`, :class:`EngineConfig`; the recipe
assembles the top-level schema from them and from the sampler, algorithm and optimizer sections).

Example:
    >>> @dataclass(kw_only=True)
    ... class Run:
    ...     output_dir: str = "runs/default"
    ...     train: TrainConfig = field(default_factory=TrainConfig)
    >>> cfg = load_config(Run, None, ["train.meta_steps=5", "output_dir=runs/example"])
    >>> cfg.train.meta_steps, cfg.output_dir
    (5, 'runs/example')
"""

from fmmeta.config.describe import describe_config, field_docs
from fmmeta.config.errors import ConfigError, raise_if_invalid
from fmmeta.config.loader import build_config, flat_config, load_config, save_resolved, to_dict
from fmmeta.config.reading import parse_overrides
from fmmeta.config.sections import (
    EMBEDDED_MODEL,
    EngineConfig,
    LoraConfig,
    ModelConfig,
    TrainConfig,
    looks_like_local_path,
    model_source_problems,
)

__all__ = [
    "EMBEDDED_MODEL",
    "ConfigError",
    "EngineConfig",
    "LoraConfig",
    "ModelConfig",
    "TrainConfig",
    "build_config",
    "flat_config",
    "describe_config",
    "field_docs",
    "load_config",
    "looks_like_local_path",
    "model_source_problems",
    "parse_overrides",
    "raise_if_invalid",
    "save_resolved",
    "to_dict",
]
