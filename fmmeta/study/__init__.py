"""Studies: a search over how adapters are meta-trained, honest about what it may look at.

A study runs trials of the train recipe (each a normal run into its own folder), scores every
trial on validation tasks only, over several seeds of episode draws, chooses one
configuration per method by that validation score alone, and only then scores the chosen
configurations, once, on the held-out tasks. Optuna is the search engine (the optional extra
``fmmeta[study]``; imported only when a study runs).

* :class:`StudyConfig` (``config``): the YAML declaration: the searched space, trials, scoring.
* ``search``: Optuna's storage, sampler and pruner, and trials left running by a killed study.
* ``scoring``: a trial's adapter scored on validation tasks; the choice scored on held-out ones.
* ``once``: the held-out tasks of a study are scored at most once.
* ``report``: ``study.json`` and ``study.md``.

``recipes/study.py`` (``fmmeta study``) tells the story top to bottom.
"""

from fmmeta.study.config import SEARCHED, MethodSpace, Range, StudyConfig, recipe_problems, searched_keys

__all__ = ["SEARCHED", "MethodSpace", "Range", "StudyConfig", "recipe_problems", "searched_keys"]
