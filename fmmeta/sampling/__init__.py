"""Task sampling: which tasks run each meta-step, on which rank, in which micro-batches."""

from fmmeta.sampling.cost import CostModel, slot_features
from fmmeta.sampling.plan import MetaBatchPlan, TaskSlot
from fmmeta.sampling.planner import PlanStats, assign_balanced, plan_meta_batch, plan_stats
from fmmeta.sampling.prefetch import Prefetched, Prefetcher
from fmmeta.sampling.sampler import CostAwareSampler, SamplerConfig
from fmmeta.sampling.source import EpisodeSource, TaskObservation
from fmmeta.sampling.strategies import STRATEGIES, PoolView, Strategy

__all__ = [
    "STRATEGIES",
    "CostAwareSampler",
    "CostModel",
    "EpisodeSource",
    "MetaBatchPlan",
    "PlanStats",
    "PoolView",
    "Prefetched",
    "Prefetcher",
    "SamplerConfig",
    "Strategy",
    "TaskObservation",
    "TaskSlot",
    "assign_balanced",
    "plan_meta_batch",
    "plan_stats",
    "slot_features",
]
