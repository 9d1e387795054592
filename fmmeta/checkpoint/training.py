"""A method's meta-training state: what its checkpoints hold, written and read back.

Why a module of its own: the train recipe checkpoints every ``train.checkpoint_every`` meta-steps
and resumes from the latest complete checkpoint, and what that takes (the adapter, every rank's
share of the outer optimizer, the sampler's state, the RNG, what the algorithm learned besides the
adapter, and the facts a resume is checked against) is one decision that belongs with the
checkpoint format, not in the recipe's story. :class:`TrainingState` names the parts once, so
saving and restoring cannot drift apart.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from fmmeta.algorithms.protocol import MetaAlgorithm
from fmmeta.atomic import replace_changed
from fmmeta.checkpoint.manager import CheckpointManager, CheckpointWriter
from fmmeta.checkpoint.resume import DATA_FINGERPRINT, RESUME_FACTS, find_resume_checkpoint, resume_facts
from fmmeta.checkpoint.state import load_rng_state, save_rng_state
from fmmeta.engine import Engine
from fmmeta.models import adapter_names, lora_shapes, model_id
from fmmeta.recipe_config import RecipeConfig
from fmmeta.sampling import Prefetcher

__all__ = ["RECIPE_STATE", "TrainingState"]

logger = logging.getLogger("fmmeta.train")

RECIPE_STATE = frozenset({"step", "prefetcher"})
"""Keys of a checkpoint's ``state.json`` the recipe owns; every other key is the algorithm's."""


def _stable_peft_config(path: Path) -> None:
    """peft writes ``target_modules`` from a set, in the order of the process's string hashes: two
    processes write the same adapter's config in two orders. Sorted, a rerun's config is byte for
    byte the one before and is not rewritten (:func:`~fmmeta.atomic.replace_changed`)."""
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")


@dataclass
class TrainingState:
    """One method's training, as its checkpoints see it.

    Args:
        cfg: the replicate's config (its resume settings and the facts a resume is checked against).
        method: the method's name.
        engine: the engine training it (adapter and outer optimizer).
        model: the peft model (its adapter's names and shapes).
        algorithm: the meta-algorithm (whatever it learns besides the adapter: metasgd's step sizes).
        prefetcher: the sampler's state, so a resumed run draws what an unbroken one would have.
        data: the meta-training data's fingerprint, so a resume over changed data is named.
    """

    cfg: RecipeConfig
    method: str
    engine: Engine
    model: nn.Module
    algorithm: MetaAlgorithm
    prefetcher: Prefetcher
    data: str

    def checkpoints(self, method_dir: Path) -> CheckpointManager:
        """The method's checkpoint folder (``<method>/checkpoints``), keeping ``train.keep_last``."""
        return CheckpointManager(
            method_dir / "checkpoints", keep_last=self.cfg.train.keep_last, rank=self.engine.rank,
            world_size=self.engine.world_size, barrier=self.engine.barrier,
        )

    def restore(self, method_dir: Path) -> int:
        """Loads the checkpoint ``train.resume`` selects; returns the first step still to run.

        Its settings were compared with this run's before anything was written
        (``claim_output_dir``); the model and LoRA shapes are compared here, with the model built.
        """
        ckpt = find_resume_checkpoint(self.cfg.train, method_dir)
        if ckpt is None:
            return 0
        ckpt.check_compatible(model_id=model_id(self.cfg.model), lora_shapes=lora_shapes(self.model))
        self.engine.load_adapter(ckpt.path / "adapter")
        self.engine.load_optimizer(ckpt.path)
        state = ckpt.load_json("state.json")
        self.prefetcher.load_state_dict(state["prefetcher"])
        try:
            self.algorithm.load_state_dict({k: v for k, v in state.items() if k not in RECIPE_STATE})
        except ValueError as err:
            raise ValueError(f"{ckpt.path / 'state.json'}: {err}") from err
        load_rng_state(ckpt, self.engine.rank)
        logger.info("resumed from %s (meta-step %d complete)", ckpt.path, ckpt.step)
        return ckpt.step + 1

    def save(self, ckpts: CheckpointManager, step: int) -> None:
        """Adapter, optimizer (every rank's share), sampler state, RNG and step, written atomically,
        and whatever the algorithm learned besides the adapter; every rank calls it."""
        state: dict[str, Any] = {"step": step, "prefetcher": self.prefetcher.state_dict()}
        learned = self.algorithm.state_dict()
        if set(learned) & RECIPE_STATE:
            raise ValueError(f"{self.method}'s state_dict() uses keys the recipe owns: "
                             f"{sorted(set(learned) & RECIPE_STATE)}")
        state.update(learned)

        def write(w: CheckpointWriter) -> None:
            self.engine.save_adapter(w.path("adapter"))
            if w.rank == 0:
                self._save_with_adapter(w.path("adapter"))
                w.add_files(p for p in w.path("adapter").iterdir() if p.is_file())
                w.save_json("state.json", state)
            w.add_files(self.engine.save_optimizer(w.directory))
            save_rng_state(w)

        ckpts.save(step, write, meta={"model_id": model_id(self.cfg.model), "lora_shapes": lora_shapes(self.model),
                                      RESUME_FACTS: resume_facts(self.cfg, self.method), DATA_FINGERPRINT: self.data})

    def save_adapter(self, adapter_dir: Path) -> Path:
        """The trained adapter in peft's format, with what the algorithm keeps next to it; every
        rank calls it, and it returns ``adapter_dir`` once the folder is complete on every rank.

        It is written beside ``adapter_dir`` first and only changed files are moved in: a rerun
        of a finished method leaves the adapter's files as they were (their times included, which
        ``fmmeta adapt`` compares with the evaluation's), and a crash mid-write leaves the old
        adapter whole."""
        fresh = adapter_dir.with_name(f".{adapter_dir.name}.writing")
        if self.engine.rank == 0 and fresh.exists():
            shutil.rmtree(fresh)  # left by a crash
        self.engine.barrier()
        self.engine.save_adapter(fresh)
        if self.engine.rank == 0:
            self._save_with_adapter(fresh)
            _stable_peft_config(fresh / "adapter_config.json")
            replace_changed(fresh, adapter_dir)
        self.engine.barrier()
        return adapter_dir

    def _save_with_adapter(self, adapter_dir: Path) -> None:
        """What the algorithm keeps next to its adapter (metasgd: ``step_sizes.json``); rank 0 calls."""
        names = adapter_names(self.model)
        self.algorithm.save_with_adapter(adapter_dir, names)
