"""Meta-algorithms over adapter parameters, one module per job.

``config`` (the inner loop's and the algorithm section's settings), ``inner_loop`` (the one
inner loop, training's and evaluation's), ``first_order`` (FOMAML, Reptile), ``meta_sgd`` (FOMAML
with learned step sizes), ``baselines`` (multi-task, MetaICL), ``anil``, ``build`` (each method's
record in :data:`METHODS`, read live, and the factory), ``meta_step`` and ``gather`` (one outer
step and every rank's record of it).

Nothing here imports DeepSpeed or accelerate; the engine (``fmmeta.engine``) hides them.
"""

from fmmeta.algorithms.answer_loss import answer_loss_sum
from fmmeta.algorithms.baselines import MetaICL, MultiTask
from fmmeta.algorithms.build import METHODS, Method, build_algorithm, register_method
from fmmeta.algorithms.config import AlgorithmConfig, InnerLoopConfig
from fmmeta.algorithms.first_order import FOMAML, Reptile
from fmmeta.algorithms.gather import GatheredStep, gather_step
from fmmeta.algorithms.inner_loop import adapt, restore, snapshot
from fmmeta.algorithms.meta_sgd import MetaSGD, StepSizes, load_step_sizes, save_step_sizes
from fmmeta.algorithms.meta_step import StepStats, meta_step
from fmmeta.algorithms.protocol import MetaAlgorithm, OuterUpdate, RankResult, RankWork, prepare_rank
from fmmeta.algorithms.task_lora import TaskLoRA, stack_adapters

__all__ = [
    "FOMAML", "METHODS", "AlgorithmConfig", "GatheredStep", "InnerLoopConfig", "MetaAlgorithm", "MetaICL",
    "MetaSGD", "Method", "MultiTask", "OuterUpdate", "RankResult", "RankWork", "Reptile", "StepSizes", "StepStats",
    "TaskLoRA", "adapt", "answer_loss_sum", "build_algorithm", "gather_step", "load_step_sizes", "meta_step",
    "prepare_rank", "register_method", "restore", "save_step_sizes", "snapshot", "stack_adapters",
]
