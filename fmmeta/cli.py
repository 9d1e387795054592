"""The ``fmmeta`` command: ``fmmeta train ...``, ``fmmeta evaluate ...``, ``fmmeta adapt ...`` and ``fmmeta study ...``.

Each subcommand hands its arguments to a recipe's ``main`` (``recipes/train.py``,
``recipes/evaluate.py``, ``recipes/adapt.py``, ``recipes/study.py``, installed as ``fmmeta.recipes``), which is what ``python recipes/train.py``
and ``python -m fmmeta.recipes.train`` run too: one entry point per recipe, whatever starts it.
Under a launcher that runs a program rather than a Python file, e.g.
``torchrun --nproc_per_node 2 --no-python fmmeta train ...``, every rank runs this command.
"""

from __future__ import annotations

import importlib
import os
import sys

__all__ = ["main"]

COMMANDS = {
    "train": ("fmmeta.recipes.train", "meta-train LoRA adapters, then evaluate them on held-out tasks"),
    "evaluate": ("fmmeta.recipes.evaluate", "evaluate saved adapters (or a finished run) on held-out tasks"),
    "adapt": ("fmmeta.recipes.adapt", "adapt a finished run's adapter to your own new task(s) and predict"),
    "study": ("fmmeta.recipes.study", "search how to meta-train on validation tasks, then score the choice once held out"),
}

USAGE = "usage: fmmeta {train,evaluate,adapt,study} [--help] [ARGS ...]\n\n" + "\n".join(
    f"  {name:<9} {about}" for name, (_, about) in COMMANDS.items()
) + "\n\n`fmmeta COMMAND --help` lists the command's options and every config key."


def main(argv: list[str] | None = None) -> int:
    """Runs ``fmmeta COMMAND ARGS``; returns the recipe's exit code (2 for an unknown command)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"{USAGE}\n\nerror: unknown command {command!r}: use train, evaluate, adapt or study", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # before the recipe imports tokenizers
    recipe = importlib.import_module(COMMANDS[command][0])
    return int(recipe.main(rest, prog=f"fmmeta {command}"))


if __name__ == "__main__":
    sys.exit(main())
