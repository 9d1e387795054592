"""Packaging that pyproject.toml cannot say: the recipes ship inside the package.

``recipes/`` stays where a reader of the repository looks for the story of a run, and installs as
``fmmeta.recipes`` (``recipes/train.py`` -> ``fmmeta.recipes.train``), so ``pip install fmmeta``
gives ``fmmeta train`` / ``python -m fmmeta.recipes.train`` without the repository. pyproject's
``packages.find`` cannot add a package from another folder to the ones it finds, and a hand-kept
list would silently drop the next new subpackage: hence these few lines. The DeepSpeed JSONs, the
accelerate configs and the example configs (smoke, study, public) ship with them (see ``fmmeta.shipped``).
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["fmmeta", "fmmeta.*"]), "fmmeta.recipes", "fmmeta.ds_configs"],
    package_dir={"fmmeta.recipes": "recipes", "fmmeta.ds_configs": "ds_configs"},
    package_data={
        "fmmeta.recipes": ["accelerate_*.yaml", "configs/smoke.yaml", "configs/study_smoke.yaml",
                           "configs/study_default.yaml", "configs/public.yaml"],
        "fmmeta.ds_configs": ["*.json"],
    },
)
