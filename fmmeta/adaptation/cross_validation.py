"""Which of a run's methods to adapt a user's task with, chosen on the user's own support rows.

A run's evaluation scores its methods on held-out tasks of the suite's shape; a user's task may
have another shape (its template, its label words), where an adapter meta-trained on the suite
can do worse than the base model. Only the user's rows can say. So every candidate (``base``,
``in_context`` and each method the run trained) is scored by k-fold cross-validation on the
support rows: each fold is held out in turn, the candidate adapts on the other folds exactly as
``fmmeta adapt`` adapts (:class:`~fmmeta.adaptation.session.Adapter`), and predicts the held
fold. Every support row is predicted once, by a candidate that never saw it.

Folds are stratified: a classification task's rows of each label are dealt to the folds in turn,
so each fold's training rows keep every label. The folds of all tasks adapt together, in the
grouped passes adapt uses for many tasks (:meth:`~fmmeta.adaptation.session.Adapter.compare`).

A candidate's held rows are scored by the registered metrics (:mod:`fmmeta.evaluation.metrics`)
that apply to the tasks' kinds, and the choice reads one of them by name, in its direction
(``--cv-metric``, accuracy unless told), with the loss to decide among candidates it cannot tell
apart: a metric registered from any module can choose.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from fmmeta.adaptation.task_files import TaskTexts
from fmmeta.errors import UserInputError
from fmmeta.evaluation.methods import BASE
from fmmeta.evaluation.metrics import (
    CLASSIFICATION,
    GENERATION,
    HEADLINE,
    KINDS,
    METRICS,
    MULTIPLE_CHOICE,
    Metric,
    get_metric,
)
from fmmeta.evaluation.scoring import QueryScore

MIN_FOLDS = 2
DEFAULT_FOLDS = 4
"""Folds by default: a 4-shot task (4 rows a label) is held out one row a label at a time."""
DEFAULT_METRIC = HEADLINE
"""The registered metric auto chooses by unless told (``--cv-metric``): the evaluation's headline."""
TIE_BREAK = "loss"
"""The registered metric that decides among candidates tied on the chosen one: the gold answer's
log-likelihood, which every row of every kind has and which moves before a ranking flips."""


def _se(values: Sequence[float]) -> float:
    """Standard error of the mean of ``values`` (0 for fewer than two)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _query_score(correct: tuple[bool, ...], nats: tuple[float, ...], tokens: tuple[int, ...]) -> QueryScore:
    """Held rows as one scored query set: loss per answer token over all of them (as adapt's
    summary counts its loss), accuracy over rows."""
    return QueryScore(loss=sum(nats) / sum(tokens), accuracy=sum(correct) / len(correct), n=len(correct),
                      n_answer_tokens=sum(tokens), correct=correct, gold_logprob=tuple(-x for x in nats))


def kind_of(texts: TaskTexts) -> str:
    """A task's kind as the evaluation names it (:data:`~fmmeta.evaluation.metrics.KINDS`): the
    metrics that apply to it score its held rows."""
    if texts.labels:
        return CLASSIFICATION
    return MULTIPLE_CHOICE if texts.options[0] else GENERATION


@dataclass(frozen=True)
class Score:
    """A candidate's cross-validated score over every held-out support row of every task.

    The held rows of all folds are one query set, each row predicted once by a candidate that
    never saw it, and every registered metric that applies to the tasks' kinds scores it with the
    ``compute`` the evaluation scores an episode's query set with; standard errors take the rows
    as the sampling unit.

    Attributes:
        correct: per held row (in one order for every candidate), whether it was predicted
            right (classification: the gold label ranked strictly first; generation: the greedy
            answer equal to the gold).
        nats: per held row, minus the log-probability of its gold answer.
        tokens: per held row, its gold answer's tokens (the same for every candidate).
        seconds: time the candidate's folds took to adapt and predict.
        kinds: the kinds of the tasks the rows come from (default: every kind, so only the
            metrics of every kind apply).
    """

    correct: tuple[bool, ...]
    nats: tuple[float, ...]
    tokens: tuple[int, ...]
    seconds: float
    kinds: frozenset[str] = frozenset(KINDS)

    @classmethod
    def of(cls, predictions: Sequence[Mapping[str, Any]], seconds: float,
           kinds: frozenset[str] = frozenset(KINDS)) -> Score:
        """The score of held rows' predictions (each with ``correct``, ``answer_logprob`` and
        ``answer_tokens``)."""
        if not predictions:
            raise ValueError("no held-out row was scored")
        return cls(tuple(bool(r["correct"]) for r in predictions),
                   tuple(-float(r["answer_logprob"]) for r in predictions),
                   tuple(int(r["answer_tokens"]) for r in predictions), seconds, kinds)

    @property
    def rows(self) -> int:
        """Held rows scored."""
        return len(self.correct)

    def held(self) -> QueryScore:
        """The held rows as one scored query set, as the evaluation scores an episode's."""
        return _query_score(self.correct, self.nats, self.tokens)

    @functools.cached_property
    def metrics(self) -> dict[str, float]:
        """Every registered metric that applies to the rows' kinds and has a value on them, by name
        (in registration order); computed once, as :meth:`value`, :meth:`se` and :meth:`minus`
        each read it for one metric."""
        held = self.held()
        values = {m.name: m.compute(held) for m in METRICS.values() if self.kinds <= m.kinds}
        return {name: v for name, v in values.items() if v is not None}

    def value(self, metric: str) -> float:
        """The held rows' value of ``metric``.

        Raises:
            UserInputError: the metric does not apply to these rows (the message lists those that do).
        """
        values = self.metrics
        if metric not in values:
            raise UserInputError(f"metric {metric!r} does not score these held-out rows (of "
                                 f"{', '.join(sorted(self.kinds))} tasks): choose among {list(values)}")
        return values[metric]

    def se(self, metric: str) -> float:
        """The standard error of :meth:`value`, rows as the sampling unit: the jackknife's (the
        metric on the rows less each row in turn), for a mean the plain standard error."""
        value, compute, n = self.value(metric), get_metric(metric).compute, self.rows
        left_out = [compute(_query_score(self.correct[:i] + self.correct[i + 1:], self.nats[:i] + self.nats[i + 1:],
                                         self.tokens[:i] + self.tokens[i + 1:])) for i in range(n)] if n > 1 else []
        return _se([n * value - (n - 1) * v for v in left_out if v is not None])

    def minus(self, other: Score, metric: str) -> tuple[float, float]:
        """This candidate less ``other`` on the same held rows in ``metric``, and the paired
        standard error of the difference: each row's share of it is what the difference loses
        when that row alone takes ``other``'s result, and the error is over rows. (For a metric
        that sums over rows, accuracy and the loss of answers both candidates share, the shares
        add up to the difference and the error is that of the row-by-row differences.) Pairing
        removes what the rows share (how hard each is), so a difference is seen with far fewer
        rows than two separate scores need; and a candidate right on every row still has a
        difference with an error."""
        value, compute, n = self.value(metric), get_metric(metric).compute, self.rows
        if other.rows != n:
            raise ValueError(f"a paired difference needs the same held rows: {n} and {other.rows}")
        swapped = [compute(_query_score(self.correct[:i] + other.correct[i:i + 1] + self.correct[i + 1:],
                                        self.nats[:i] + other.nats[i:i + 1] + self.nats[i + 1:], self.tokens))
                   for i in range(n)]
        return value - other.value(metric), _se([n * (value - v) for v in swapped if v is not None])

    def as_dict(self) -> dict[str, float | int]:
        """Rounded for ``summary.json``: each metric and its standard error, rows and seconds."""
        out: dict[str, float | int] = {}
        for name, value in self.metrics.items():
            out |= {name: round(value, 4), f"{name}_se": round(self.se(name), 4)}
        return out | {"rows": self.rows, "seconds": round(self.seconds, 3)}


def _rows_by_fold(texts: TaskTexts, k: int) -> list[list[int]]:
    """Support row indices of each of ``k`` folds: each label's rows dealt in turn (a task
    without labels: all rows dealt in turn), continuing where the previous label stopped so the
    folds stay even in size."""
    answers = texts.answers[0]
    order = sorted(range(len(answers)), key=lambda i: texts.labels.index(answers[i])) if texts.labels else \
        list(range(len(answers)))
    folds: list[list[int]] = [[] for _ in range(k)]
    for position, i in enumerate(order):
        folds[position % k].append(i)
    return [sorted(f) for f in folds]


def most_folds(texts: TaskTexts) -> int:
    """The most folds the task's support allows: every fold's training rows keep each label
    (a classification task: its rarest label's row count), else its row count."""
    answers = texts.answers[0]
    if texts.labels:
        return min(sum(a == label for a in answers) for label in texts.labels)
    return len(answers)


def fold_count(tasks: Sequence[TaskTexts], requested: int) -> int:
    """``requested`` folds, fewer where a task's support holds fewer rows (of a label).

    Raises:
        UserInputError: ``requested`` < 2, or a task's support cannot be split in two folds.
    """
    if requested < MIN_FOLDS:
        raise UserInputError(f"--folds {requested} is invalid: cross-validation needs >= {MIN_FOLDS} folds")
    for texts in tasks:
        if most_folds(texts) < MIN_FOLDS:
            what = "of one of its labels" if texts.labels else "in all"
            raise UserInputError(f"task {texts.files.name!r} has 1 support row {what}: cross-validation holds rows "
                                 f"out in turn and needs >= {MIN_FOLDS} (of each label); add rows, or name a method "
                                 "with --method instead of auto / --compare")
    return min(requested, *(most_folds(t) for t in tasks))


def folds(texts: TaskTexts, k: int) -> list[TaskTexts]:
    """The task's ``k`` folds as tasks: the other folds' support rows as support, the fold's rows
    (with their labels) as query."""
    out = []
    for i, held in enumerate(_rows_by_fold(texts, k)):
        out_of_fold = set(held)
        keep = [j for j in range(len(texts.support)) if j not in out_of_fold]

        def split(values: Sequence[Any]) -> tuple[list[Any], list[Any]]:
            return [values[j] for j in keep], [values[j] for j in held]

        options, gold = texts.options[0], texts.gold[0]
        out.append(dataclasses.replace(
            texts, files=dataclasses.replace(texts.files, name=f"{texts.files.name} (fold {i + 1} of {k})"),
            support=split(texts.support)[0], prompts=split(texts.prompts[0]), answers=split(texts.answers[0]),
            options=split(options) if options else ([], []), gold=split(gold) if gold else ([], [])))
    return out


def _better(metric: Metric, difference: float) -> float:
    """How much better a difference ``a - b`` in ``metric`` says ``a`` is than ``b``."""
    return difference if metric.higher_is_better else -difference


def _best_word(metric: Metric) -> str:
    return "highest" if metric.higher_is_better else "lowest"


def choose(scores: Mapping[str, Score], order: Sequence[str], metric: str = DEFAULT_METRIC) -> tuple[str, str]:
    """The candidate to adapt with, and why in one sentence.

    The best cross-validated ``metric`` (a registered metric, in its direction) wins, unless a
    simpler candidate (earlier in ``order``: base, in_context, then the run's methods) trails it
    by no more than the paired standard error of the difference; among candidates so tied, the
    best :data:`TIE_BREAK` (loss), again unless a simpler one is within one paired standard error
    of it. With a few rows, a meta-trained adapter must lead, not merely match.
    """
    first, then = get_metric(metric), get_metric(TIE_BREAK)
    ranked = [m for m in order if m in scores]

    def best(candidates: Sequence[str], by: Metric) -> str:  # max and min keep the first, the simplest, of equals
        return (max if by.higher_is_better else min)(candidates, key=lambda m: scores[m].value(by.name))

    def trails(m: str, lead: str, by: Metric) -> bool:
        """Whether ``m`` trails ``lead`` by no more than the paired standard error (one row of
        difference alone is exactly one error: rounding must not decide it)."""
        difference, se = scores[lead].minus(scores[m], by.name)
        return _better(by, difference) <= se + 1e-12

    leader = best(ranked, first)
    tied = [m for m in ranked if trails(m, leader, first)]
    settled = best(tied, then)
    chosen = next(m for m in tied if trails(m, settled, then))
    s = scores[chosen]
    why = f"cross-validated {first.name} {s.value(first.name):.3f} ± {s.se(first.name):.3f}" + (
        f", {then.name} {s.value(then.name):.4f}" if then is not first else "")
    others = [m for m in tied if m != chosen]
    if not others:
        return chosen, why + ": ahead of every other candidate by more than the paired standard error"
    why += f"; {', '.join(others)} within one paired standard error of the best {first.name}"
    if chosen != settled:
        return chosen, why + (f", and it within one of {settled}'s {_best_word(then)} {then.name} "
                              f"{scores[settled].value(then.name):.4f}: the simpler")
    return chosen, why + f": the {_best_word(then)} {then.name} among them"


def below_base(method: str, scores: Mapping[str, Score], metric: str = DEFAULT_METRIC) -> str | None:
    """A one-line warning when ``method`` does worse than the base model on the user's rows by
    more than the paired standard error (in ``metric``; in :data:`TIE_BREAK` where ``metric``
    does not tell)."""
    if method == BASE or BASE not in scores or method not in scores:
        return None
    first, then = get_metric(metric), get_metric(TIE_BREAK)
    m, b = scores[method], scores[BASE]
    difference, se = m.minus(b, first.name)
    if -_better(first, difference) > se + 1e-12:  # one row alone is one error, as in choose
        return (f"{method}'s cross-validated {first.name} on your support rows, {m.value(first.name):.3f}, is "
                f"{'below' if first.higher_is_better else 'above'} the base model's {b.value(first.name):.3f} by "
                f"{abs(difference):.3f} ± {se:.3f}: its meta-training does not fit this task; --method base (or "
                "auto) adapts the base model instead")
    tie_difference, tie_se = m.minus(b, then.name)
    if _better(first, difference) <= se + 1e-12 and -_better(then, tie_difference) > tie_se + 1e-12:
        return (f"{method}'s cross-validated {then.name} on your support rows, {m.value(then.name):.4f}, is "
                f"{'below' if then.higher_is_better else 'above'} the base model's {b.value(then.name):.4f} by "
                f"{abs(tie_difference):.4f} ± {tie_se:.4f}, at no better {first.name}: --method base (or auto) "
                "may fit this task better")
    return None


def scorable(kinds: frozenset[str]) -> list[str]:
    """The registered metrics cross-validation can choose by for tasks of ``kinds``: those that
    apply to every one of them and have a value on held rows as cross-validation scores them
    (each row's correctness and its gold answer's log-probability; no per-token ranking)."""
    probe = Score((True, False), (0.5, 1.5), (1, 2), 0.0).held()
    return [m.name for m in METRICS.values() if kinds <= m.kinds and m.compute(probe) is not None]


def cv_metric(name: str, tasks: Sequence[TaskTexts]) -> Metric:
    """The registered metric ``name``, checked to score the cross-validation of ``tasks``.

    Raises:
        UserInputError: no metric of that name is registered, or it does not apply to a task's
            kind (the message lists those that do).
    """
    kinds = frozenset(kind_of(t) for t in tasks)
    usable = scorable(kinds)
    if name in usable:
        return get_metric(name)
    close = difflib.get_close_matches(name, usable, n=1)
    what = (f"does not score {' and '.join(sorted(kinds))} tasks' held-out rows" if name in METRICS
            else "is not a registered metric")
    raise UserInputError(f"--cv-metric {name!r} {what}" + (f" (did you mean {close[0]!r}?)" if close else "")
                         + f": cross-validation of these tasks can choose by {', '.join(usable)}")


def cross_validate(adapt_with: Callable[[str, list[TaskTexts]], list[list[dict[str, Any]]]],
                   candidates: Sequence[str], tasks: Sequence[TaskTexts], k: int,
                   clock: Callable[[], float]) -> dict[str, Score]:
    """Every candidate's :class:`Score` over the ``k`` folds of every task.

    Args:
        adapt_with: adapts the given fold tasks with a candidate, all in one grouped call, and
            returns each task's predictions of its query (the held rows).
        candidates: the candidates' names, as ``adapt_with`` takes them.
        tasks: the user's tasks, read and checked.
        k: folds per task (:func:`fold_count`).
        clock: seconds, for each candidate's cost.
    """
    fold_tasks = [f for t in tasks for f in folds(t, k)]
    kinds = frozenset(kind_of(t) for t in tasks)
    scores = {}
    for name in candidates:
        start = clock()
        predictions = [row for rows in adapt_with(name, fold_tasks) for row in rows]
        scores[name] = Score.of(predictions, clock() - start, kinds)
    return scores


@dataclass(frozen=True)
class Comparison:
    """What ``--method auto`` / ``--compare`` found on the user's support rows.

    Attributes:
        folds: folds per task.
        scores: each candidate's score, simplest first.
        chosen: the best candidate (:func:`choose`) and ``why``.
        skipped: candidates the run cannot adapt, with the reason (e.g. no lr chosen for it).
    """

    folds: int
    scores: dict[str, Score]
    chosen: str
    why: str
    skipped: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        """For ``summary.json``."""
        return {"folds": self.folds, "chosen": self.chosen, "why": self.why,
                "candidates": {m: s.as_dict() for m, s in self.scores.items()}, "skipped": dict(self.skipped)}


__all__ = ["DEFAULT_FOLDS", "DEFAULT_METRIC", "MIN_FOLDS", "TIE_BREAK", "Comparison", "Score", "below_base",
           "choose", "cross_validate", "cv_metric", "fold_count", "folds", "kind_of", "most_folds", "scorable"]
