"""Experiment trackers (``train.report_to``): TensorBoard and Weights & Biases, rank 0 only.

Every tracker is fed the records ``metrics.jsonl`` holds, through :class:`MetricsLog`, so the
file and the trackers cannot disagree. Each method is one tracker run (``<output_dir>/tensorboard/
<method>``, a wandb run named after the method in a group named after the run folder): methods
restart their step count at 0, so one run per method puts them side by side on the same chart,
where a method prefix in one run would give each method charts of its own. The held-out
evaluation is one more run, ``eval``, with the report's table and plots.
"""

from fmmeta.tracking.metrics_log import MetricsLog
from fmmeta.tracking.protocol import Tracker
from fmmeta.tracking.select import (
    TRACKERS,
    open_trackers,
    report_evaluation,
    report_to_problems,
    tracker_names,
)

__all__ = [
    "TRACKERS",
    "MetricsLog",
    "Tracker",
    "open_trackers",
    "report_evaluation",
    "report_to_problems",
    "tracker_names",
]
