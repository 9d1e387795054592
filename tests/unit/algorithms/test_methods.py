"""A method's facts have one home, its record in ``METHODS``, and the registry is read live."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fmmeta.algorithms import FOMAML, METHODS, Method, register_method
from fmmeta.algorithms.anil import ANIL
from fmmeta.algorithms.baselines import MetaICL, MultiTask
from fmmeta.algorithms.config import AlgorithmConfig, ANILConfig
from fmmeta.algorithms.first_order import Reptile
from fmmeta.algorithms.meta_sgd import MetaSGD
from fmmeta.config import ConfigError, load_config
from fmmeta.recipe_config import RecipeConfig


@pytest.fixture
def toy() -> Iterator[Method]:
    """The method "toy" (FOMAML under another name), registered for one test and removed after."""
    method = register_method(Method("toy", FOMAML, budget="{k} toy steps.", fast_weights=True))
    try:
        yield method
    finally:
        del METHODS[method.name]


def test_the_facts_are_on_the_record_only() -> None:
    """Name and fast weights were written on each class and again on its record, free to
    disagree; the classes keep only what a run's settings decide."""
    for cls in (FOMAML, Reptile, MetaSGD, ANIL, MultiTask, MetaICL):
        assert not hasattr(cls, "name") and not hasattr(cls, "fast_weights"), cls
    assert [m for m, r in METHODS.items() if r.fast_weights] == ["fomaml", "metasgd", "reptile", "anil"]
    names = [f"base_model.model.layers.{i}.q.lora_A" for i in range(3)]
    cfg = AlgorithmConfig(anil=ANILConfig(layers=2))
    assert METHODS["anil"].adapted_tensors(cfg, names) == ANIL.inner_tensors(cfg, names) == [1, 2]


def test_a_method_registered_after_import_is_one_methods_accepts(toy: Method) -> None:
    import fmmeta
    from fmmeta.algorithms import build

    assert fmmeta.METHODS["toy"] is toy and fmmeta.METHODS is METHODS and "toy" in build.ALGORITHMS
    cfg = load_config(RecipeConfig, None, ["methods=[fomaml, toy]"])
    assert cfg.methods == ("fomaml", "toy")
    assert isinstance(build.build_algorithm("toy", cfg.algorithm, pad_id=0), FOMAML)
    with pytest.raises(ConfigError, match=r"methods=\['tyo'\] is invalid: choose one or more of .*, anil, toy"):
        load_config(RecipeConfig, None, ["methods=[tyo]"])
