"""The whole recipe schema, walked key by key: help for every key, and no key that lies.

Both tests are generated from ``RecipeConfig`` itself, so a new key is covered the day it is
added, and ``--help`` cannot drift from what a run uses.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from fmmeta.config import ConfigError, field_docs, load_config, to_dict
from fmmeta.recipe_config import RecipeConfig

ROOT = Path(__file__).resolve().parents[3]


def _leaves(cls: type, value: Any, prefix: str = "") -> list[tuple[str, Any, Any, str]]:
    """``(dotted key, type, value, doc)`` for every settable leaf under ``value``."""
    out = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        tp, v = hints[f.name], getattr(value, f.name)
        if dataclasses.is_dataclass(tp):
            out.extend(_leaves(tp, v, f"{prefix}{f.name}."))
        elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            continue  # a list of sections (tasks.collection): its items have no default to walk
        else:
            out.append((f"{prefix}{f.name}", tp, v, docs.get(f.name, "")))
    return out


RUN_DEFAULTS = load_config(RecipeConfig, None, [])  # exactly what `recipes/train.py` runs with
LEAVES = _leaves(RecipeConfig, RUN_DEFAULTS)


def _help_text(capsys: pytest.CaptureFixture[str]) -> str:
    spec = importlib.util.spec_from_file_location("train_recipe", ROOT / "recipes" / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    return capsys.readouterr().out


def test_help_shows_the_run_default_and_a_doc_for_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_help_text(capsys).split())  # argparse re-wraps nothing in the epilog; be safe
    assert len(LEAVES) > 70
    for key, _, value, doc in LEAVES:
        assert doc, f"{key} has no doc (write a string literal under the field)"
        assert f"{key} (" in text, f"{key} missing from --help"
        line = text[text.index(f" {key} (") :]
        assert f", default {value!r}): {doc}" in line[: len(key) + 200 + len(doc)], (
            f"--help shows a wrong default or doc for {key}; the run uses {value!r}"
        )
    # The values where the recipe departs from its sections' class defaults.
    assert "sampler.meta_batch_size (int | one of 'auto', default 4)" in text
    assert "optim.outer_lr (float, default 0.003)" in text
    assert "train.meta_steps (int, default 20)" in text


def _other_value(tp: Any, value: Any) -> Any:
    """A valid-looking value of type ``tp`` that differs from ``value``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, __import__("types").UnionType):
        inner = [a for a in args if a is not type(None)][0]
        # e.g. int | Literal["auto"] at "auto": another value is a number
        plain = value is None or (isinstance(inner, type) and not isinstance(value, inner))
        return _other_value(inner, None) if plain else _other_value(inner, value)
    if origin is Literal:
        return next(a for a in args if a != value)
    if tp is bool:
        return not value
    if tp is int:
        return 2 if value is None else value + 1
    if tp is float:
        return 0.5 if value is None else (value * 0.5 if value else 0.25)
    if tp in (str, Path):
        return "other" if value is None else f"{value}_other"
    if origin is tuple:
        if len(args) == 2 and args[1] is not Ellipsis:
            return [_other_value(args[0], value[0]), value[1]]
        if len(value) > 1:
            return list(value[:-1])
        return [*value, _other_value(args[0], value[0] if value else None)]
    if origin is list:
        return ["other"]
    if origin is dict:
        return {"other": 1}
    raise AssertionError(f"no alternative value for type {tp}")


@pytest.mark.parametrize(("key", "tp", "value"), [leaf[:3] for leaf in LEAVES], ids=[leaf[0] for leaf in LEAVES])
def test_every_key_does_what_it_says_or_is_refused(key: str, tp: Any, value: Any) -> None:
    """Set each key to another value: the run's config must hold exactly that value (nothing
    overwrites it afterwards), or the loader must refuse it naming the key."""
    wanted = _other_value(tp, value)
    try:
        cfg = load_config(RecipeConfig, None, [f"{key}={json.dumps(wanted)}"])
    except ConfigError as err:
        section, _, name = key.rpartition(".")
        named = [p for p in err.problems if name in p or (section.count(".") and section in p)]
        assert named, f"{key} refused without naming it or its section: {err.problems}"
        return
    got: Any = to_dict(cfg)
    for part in key.split("."):
        got = got[part]
    assert got == wanted, f"{key}={wanted!r} was set but the run would use {got!r}"


def _names_read_by_the_code() -> set[str]:
    """Attribute names (and exact string literals, for ``getattr``) anywhere in the library and
    recipes, outside ``validate`` methods: a key that is only validated changes nothing."""
    names: set[str] = set()
    for path in [*ROOT.joinpath("fmmeta").rglob("*.py"), *ROOT.joinpath("recipes").rglob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "validate"
                for n in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # getattr(cfg, "held_out_fraction") in a loop over names
    return names


def test_every_key_is_read_by_the_code() -> None:
    read = _names_read_by_the_code()
    unread = [key for key, *_ in LEAVES if key.rsplit(".", 1)[-1] not in read]
    assert not unread, f"keys no code reads (remove them, or use them): {unread}"
