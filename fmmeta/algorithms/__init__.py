"""Meta-algorithms over adapter parameters: the one inner loop, FOMAML, Meta-SGD, Reptile, multi-task,
meta_step and the gather of every rank's step.

Nothing here imports DeepSpeed or accelerate; the engine (``fmmeta.engine``) hides them.
"""

from fmmeta.algorithms.first_order import FOMAML, AlgorithmConfig, MultiTask, Reptile, build_algorithm
from fmmeta.algorithms.gather import GatheredStep, gather_step
from fmmeta.algorithms.inner_loop import InnerLoopConfig, adapt, answer_loss_sum, restore, snapshot
from fmmeta.algorithms.meta_sgd import MetaSGD, StepSizes, load_inner_lrs, save_inner_lrs
from fmmeta.algorithms.meta_step import StepStats, meta_step
from fmmeta.algorithms.protocol import MetaAlgorithm, OuterUpdate, RankResult, RankWork, prepare_rank
from fmmeta.algorithms.task_lora import TaskLoRA, stack_adapters

__all__ = [
    "FOMAML", "AlgorithmConfig", "GatheredStep", "InnerLoopConfig", "MetaAlgorithm", "MetaSGD", "MultiTask",
    "OuterUpdate", "RankResult", "RankWork", "Reptile", "StepSizes", "StepStats", "TaskLoRA", "adapt",
    "answer_loss_sum", "build_algorithm", "gather_step", "load_inner_lrs", "meta_step", "prepare_rank", "restore",
    "save_inner_lrs", "snapshot", "stack_adapters",
]
