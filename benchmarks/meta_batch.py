"""The meta-batch trade-off: the meta-gradient's variance and a meta-step's cost against B.

A meta-step averages B tasks' outer gradients. Its variance around the expected meta-gradient
falls as ``tr(Sigma) / B`` when the tasks are independent draws, while its cost grows about
linearly in B; B_noise = tr(Sigma) / |G|^2 (:mod:`fmmeta.sampling.noise_scale`) is where the
two meet. A run estimates tr(Sigma) and |G|^2 *inside* each meta-batch, from its tasks' spread.
This checks that estimate against the thing it predicts, measured directly: at one fixed adapter,
the recipe's sampler draws ``--draws`` independent meta-batches of every size b, the algorithm
computes each one's mean outer gradient G_b, and the spread of the G_b across draws is the
variance a meta-step of b tasks really has (sampler's strategy included: the default diversity
strategy draws tasks of different families together, which is not independent draws).

For each b it prints the measured variance, the 1/B law's prediction from the within-batch
estimate pooled over every draw, their ratio (1 where the law holds), the cost model's price of
a meta-step of b tasks (lockstep, in its unit) and its measured seconds; then B_noise. ``--figure``
draws both curves against B with B_noise marked.

Usage:
    python benchmarks/meta_batch.py [--method fomaml] [--sizes 1,2,4,8,16] [--draws 8]
        [--adapter runs/default/fomaml/adapter] [--figure meta_batch.png] [--threads 2]
    python benchmarks/meta_batch.py --tiny       # a random tiny model: seconds

The last line of output is one JSON object with the measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (benchmarks/common.py)
    add_dtype_argument,
    add_model_arguments,
    add_pass_arguments,
    compute_dtype,
    model_name,
    recipe_config,
    trained_model_and_tasks,
)

from fmmeta.algorithms.build import build_algorithm  # noqa: E402
from fmmeta.evaluation.run import read_adapter_state  # noqa: E402
from fmmeta.sampling.noise_scale import GradientNoise  # noqa: E402
from fmmeta.sampling.planner import plan_stats  # noqa: E402
from fmmeta.sampling.sampler import CostAwareSampler  # noqa: E402


@dataclasses.dataclass
class Draws:
    """The mean outer gradients of ``draws`` meta-batches of one size, and their statistics."""

    size: int
    means: list[torch.Tensor]  # one flattened fp32 G_b per draw
    within: list[GradientNoise]  # each draw's own estimate (what a run records)
    lockstep: list[float]  # the cost model's price of each draw's plan
    seconds: list[float]  # the algorithm's measured wall time per draw

    @property
    def variance(self) -> float:
        """E|G_b - E G_b|^2, unbiased over the draws: the variance a meta-step of b tasks has."""
        stacked = torch.stack(self.means)
        return float((stacked - stacked.mean(0)).square().sum()) / (len(self.means) - 1)


def measure(size: int, draws: int, sampler: CostAwareSampler, algorithm, model, params) -> Draws:
    """``draws`` meta-batches of ``size`` tasks from the sampler (steps 0.. of a sampler of that
    size): each one's mean outer gradient at the current adapter, its price and its time."""
    out = Draws(size, [], [], [], [])
    for step in range(draws):
        plan = sampler.sample(step)
        work = algorithm.prepare(plan.for_rank(0))
        start = time.perf_counter()
        result = algorithm.rank_gradient(model, params, work)
        out.seconds.append(time.perf_counter() - start)
        mean = torch.cat([g.detach().float().flatten() for g in result.grads]) / size
        out.means.append(mean)
        task_sq = float(result.task_grad_sq.sum()) / size if result.task_grad_sq is not None else math.nan
        out.within.append(GradientNoise(size, task_sq, float(mean.square().sum())))
        out.lockstep.append(plan_stats(plan, support_repeats=algorithm.support_repeats,
                                       cost_model=sampler.cost_model).lockstep)
    return out


def pooled(measured: list[Draws]) -> tuple[float, float]:
    """tr(Sigma) and |G|^2 as a run estimates them (within each meta-batch), averaged over every
    draw of two or more tasks."""
    within = [w for d in measured for w in d.within if w.tasks > 1]
    return (sum(w.trace for w in within) / len(within), sum(w.signal for w in within) / len(within))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_pass_arguments(ap)
    add_dtype_argument(ap)
    ap.add_argument("--method", default="fomaml", choices=["fomaml", "metasgd", "anil", "reptile"])
    ap.add_argument("--sizes", default="1,2,4,8,16", help="tasks per meta-step to measure")
    ap.add_argument("--draws", type=int, default=8, help="independent meta-batches per size (>= 2)")
    ap.add_argument("--adapter", type=Path, help="a run's adapter folder to measure at (default: "
                    "random values of a trained adapter's scale)")
    ap.add_argument("--figure", type=Path, help="write the trade-off figure here (PNG)")
    args = ap.parse_args()
    if args.draws < 2:
        ap.error(f"--draws={args.draws} is invalid: the variance across draws needs >= 2")
    compute_dtype(args)
    cfg = recipe_config(args)
    model, params, tok, suite = trained_model_and_tasks(args, cfg)
    if args.adapter:
        with torch.no_grad():
            for p, saved in zip(params, read_adapter_state(model, args.adapter), strict=True):
                p.copy_(saved)
    algorithm = build_algorithm(args.method, cfg.algorithm, tok.pad_token_id)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    measured = []
    for size in sizes:
        sampler = CostAwareSampler(
            suite.meta_train, dataclasses.replace(cfg.sampler, meta_batch_size=size), world_size=1, seed=0,
            support_draws=algorithm.support_draws, support_repeats=algorithm.support_repeats)
        measured.append(measure(size, args.draws, sampler, algorithm, model, params))
    trace, signal = pooled(measured)
    rows = [{
        "tasks": d.size, "variance": d.variance, "predicted": trace / d.size,
        "measured_over_predicted": round(d.variance / (trace / d.size), 3),
        "lockstep_cost": round(sum(d.lockstep) / len(d.lockstep), 1),
        "seconds": round(sum(d.seconds) / len(d.seconds), 4),
    } for d in measured]
    b_noise = trace / signal if signal > 0 else math.nan
    if args.figure:
        draw_figure(rows, b_noise, args.figure, f"{args.method}, {model_name(args)}")
    print(json.dumps({
        "model": model_name(args), "dtype": args.dtype, "method": args.method, "draws": args.draws,
        "adapter": str(args.adapter) if args.adapter else None, "trace": trace, "signal": signal,
        "b_noise": round(b_noise, 2), "sizes": rows, "threads": args.threads,
    }))


def draw_figure(rows: list[dict], b_noise: float, path: Path, title: str) -> None:
    """Variance (measured points, the 1/B law as a line) and cost against B, B_noise marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["tasks"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.loglog(sizes, [r["predicted"] for r in rows], "-", color="C0", label="tr(Σ)/B (within-batch estimate)")
    ax.loglog(sizes, [r["variance"] for r in rows], "o", color="C0", label="measured across draws")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("tasks per meta-step B")
    ax.set_ylabel("meta-gradient variance E|G_B - G|²", color="C0")
    if math.isfinite(b_noise):
        ax.axvline(b_noise, color="k", linestyle=":", label=f"B_noise = {b_noise:.1f}")
    cost = ax.twinx()
    cost.plot(sizes, [r["lockstep_cost"] for r in rows], "s--", color="C1")
    cost.set_ylabel("cost per meta-step (cost model, lockstep)", color="C1")
    ax.legend(loc="upper center", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
