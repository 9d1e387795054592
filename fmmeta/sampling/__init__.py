"""Task sampling: which tasks run each meta-step, on which rank, packed into which passes."""

from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.plan import DUMMY_PASS, MetaBatchPlan, PackedPass, RankPlan, TaskSlot
from fmmeta.sampling.planner import PlanStats, assign_tasks, plan_meta_batch, plan_stats
from fmmeta.sampling.prefetch import Prefetched, Prefetcher
from fmmeta.sampling.rows_plan import fast_weight_megabytes, plan_cost, plan_placed, plan_rows_across_ranks
from fmmeta.sampling.sampler import CostAwareSampler, PoolTooSmallError, SamplerConfig, check_pool_size
from fmmeta.sampling.source import (
    EpisodeSource,
    NoiseObservation,
    Observation,
    PassObservation,
    TaskObservation,
    observation_from_dict,
)
from fmmeta.sampling.strategies import STRATEGIES, PoolView, Strategy

__all__ = [
    "DUMMY_PASS",
    "STRATEGIES",
    "CostAwareSampler",
    "CostModel",
    "EpisodeSource",
    "MetaBatchPlan",
    "NoiseObservation",
    "Observation",
    "PackedPass",
    "PassObservation",
    "PlanStats",
    "PoolTooSmallError",
    "PoolView",
    "Prefetched",
    "Prefetcher",
    "RankPlan",
    "SamplerConfig",
    "Strategy",
    "TaskObservation",
    "TaskSlot",
    "assign_tasks",
    "check_pool_size",
    "fast_weight_megabytes",
    "observation_from_dict",
    "plan_meta_batch",
    "plan_cost",
    "plan_placed",
    "plan_rows_across_ranks",
    "plan_stats",
]
