"""Meta-algorithms over adapter parameters: the one inner loop, FOMAML, Reptile, multi-task, meta_step.

Nothing here imports DeepSpeed or accelerate; the engine (``fmmeta.engine``) hides them.
"""

from fmmeta.algorithms.first_order import FOMAML, AlgorithmConfig, MultiTask, Reptile, build_algorithm
from fmmeta.algorithms.inner_loop import InnerLoopConfig, adapt, answer_loss_sum, restore, snapshot
from fmmeta.algorithms.meta_step import StepStats, meta_step
from fmmeta.algorithms.protocol import MetaAlgorithm, RankResult, RankWork, prepare_rank
from fmmeta.algorithms.task_lora import TaskLoRA, stack_adapters

__all__ = [
    "FOMAML", "AlgorithmConfig", "InnerLoopConfig", "MetaAlgorithm", "MultiTask", "RankResult",
    "RankWork", "Reptile", "StepStats", "TaskLoRA", "adapt", "answer_loss_sum", "build_algorithm",
    "meta_step", "prepare_rank", "restore", "snapshot", "stack_adapters",
]
