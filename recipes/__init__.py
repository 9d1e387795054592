"""The recipes: ``train.py`` and ``evaluate.py`` tell the story of a run top to bottom.

Installed as ``fmmeta.recipes`` (see setup.py), so every launcher can run them by module
(``python -m fmmeta.recipes.train``, ``torchrun -m``, ``deepspeed --module``, ``accelerate launch -m``)
and the ``fmmeta train`` / ``fmmeta evaluate`` commands call their ``main`` functions.
"""
