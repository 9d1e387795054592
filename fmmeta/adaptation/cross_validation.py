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
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from fmmeta.adaptation.task_files import TaskTexts
from fmmeta.errors import UserInputError
from fmmeta.evaluation.methods import BASE

MIN_FOLDS = 2
DEFAULT_FOLDS = 4
"""Folds by default: a 4-shot task (4 rows a label) is held out one row a label at a time."""


def _se(values: Sequence[float]) -> float:
    """Standard error of the mean of ``values`` (0 for fewer than two)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


@dataclass(frozen=True)
class Score:
    """A candidate's cross-validated score over every held-out support row of every task.

    Attributes:
        correct: per held row (in one order for every candidate), whether it was predicted
            right (classification: the gold label ranked strictly first; generation: the greedy
            answer equal to the gold).
        nats: per held row, minus the log-probability of its gold answer.
        tokens: per held row, its gold answer's tokens (the same for every candidate).
        seconds: time the candidate's folds took to adapt and predict.
    """

    correct: tuple[bool, ...]
    nats: tuple[float, ...]
    tokens: tuple[int, ...]
    seconds: float

    @classmethod
    def of(cls, predictions: Sequence[Mapping[str, Any]], seconds: float) -> Score:
        """The score of held rows' predictions (each with ``correct``, ``answer_logprob`` and
        ``answer_tokens``)."""
        if not predictions:
            raise ValueError("no held-out row was scored")
        return cls(tuple(bool(r["correct"]) for r in predictions),
                   tuple(-float(r["answer_logprob"]) for r in predictions),
                   tuple(int(r["answer_tokens"]) for r in predictions), seconds)

    @property
    def rows(self) -> int:
        """Held rows scored."""
        return len(self.correct)

    @property
    def accuracy(self) -> float:
        """The share of held rows predicted right."""
        return sum(self.correct) / self.rows

    @property
    def accuracy_se(self) -> float:
        """Its standard error over rows."""
        return _se([float(c) for c in self.correct])

    @property
    def loss(self) -> float:
        """Nats per answer token over all held rows (as adapt's summary counts its loss)."""
        return sum(self.nats) / sum(self.tokens)

    @property
    def loss_se(self) -> float:
        """Its standard error, rows as the sampling unit (the delta method for a ratio of sums)."""
        return _se([n - self.loss * t for n, t in zip(self.nats, self.tokens)]) * self.rows / sum(self.tokens)

    def minus(self, other: Score) -> tuple[float, float, float, float]:
        """This candidate less ``other`` on the same held rows, paired row by row: the accuracy
        difference and its standard error, the loss difference and its standard error. Pairing
        removes what the rows share (how hard each is), so a difference is seen with far fewer
        rows than two separate scores need; and a candidate right on every row still has a
        difference with an error."""
        accuracy = [float(a) - float(b) for a, b in zip(self.correct, other.correct, strict=True)]
        loss = [a - b for a, b in zip(self.nats, other.nats, strict=True)]
        per_token = self.rows / sum(self.tokens)
        return (self.accuracy - other.accuracy, _se(accuracy), self.loss - other.loss, _se(loss) * per_token)

    def as_dict(self) -> dict[str, float | int]:
        """Rounded for ``summary.json``."""
        return {"accuracy": round(self.accuracy, 4), "accuracy_se": round(self.accuracy_se, 4),
                "loss": round(self.loss, 4), "loss_se": round(self.loss_se, 4), "rows": self.rows,
                "seconds": round(self.seconds, 3)}


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


def choose(scores: Mapping[str, Score], order: Sequence[str]) -> tuple[str, str]:
    """The candidate to adapt with, and why in one sentence.

    The best cross-validated accuracy wins, unless a simpler candidate (earlier in ``order``:
    base, in_context, then the run's methods) trails it by no more than the paired standard
    error of the difference; among candidates so tied, the lowest loss, again unless a simpler
    one is within one paired standard error of it. With a few rows, a meta-trained adapter must
    lead, not merely match.
    """
    ranked = [m for m in order if m in scores]
    leader = max(ranked, key=lambda m: scores[m].accuracy)  # max keeps the first, the simplest, of equals

    def trails(m: str, best: str, loss: bool) -> bool:
        """Whether ``m`` trails ``best`` by no more than the paired standard error (one row of
        difference alone is exactly one error: rounding must not decide it)."""
        accuracy, accuracy_se, nats, nats_se = scores[best].minus(scores[m])
        return -nats <= nats_se + 1e-12 if loss else accuracy <= accuracy_se + 1e-12

    tied = [m for m in ranked if trails(m, leader, loss=False)]
    lowest = min(tied, key=lambda m: scores[m].loss)
    chosen = next(m for m in tied if trails(m, lowest, loss=True))
    s = scores[chosen]
    why = f"cross-validated accuracy {s.accuracy:.3f} ± {s.accuracy_se:.3f}, loss {s.loss:.4f}"
    others = [m for m in tied if m != chosen]
    if not others:
        return chosen, why + ": ahead of every other candidate by more than the paired standard error"
    why += f"; {', '.join(others)} within one paired standard error of the best accuracy"
    if chosen != lowest:
        return chosen, why + f", and it within one of {lowest}'s lowest loss {scores[lowest].loss:.4f}: the simpler"
    return chosen, why + ": the lowest loss among them"


def below_base(method: str, scores: Mapping[str, Score]) -> str | None:
    """A one-line warning when ``method`` does worse than the base model on the user's rows by
    more than the paired standard error (accuracy; the loss where accuracy does not tell)."""
    if method == BASE or BASE not in scores or method not in scores:
        return None
    m, b = scores[method], scores[BASE]
    accuracy, accuracy_se, loss, loss_se = m.minus(b)
    if accuracy < -accuracy_se:
        return (f"{method}'s cross-validated accuracy on your support rows, {m.accuracy:.3f}, is below the base "
                f"model's {b.accuracy:.3f} by {-accuracy:.3f} ± {accuracy_se:.3f}: its meta-training does not fit "
                "this task; --method base (or auto) adapts the base model instead")
    if accuracy <= accuracy_se and loss > loss_se:
        return (f"{method}'s cross-validated loss on your support rows, {m.loss:.4f}, is above the base model's "
                f"{b.loss:.4f} by {loss:.4f} ± {loss_se:.4f}, at no better accuracy: --method base (or auto) may fit "
                "this task better")
    return None


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
    scores = {}
    for name in candidates:
        start = clock()
        predictions = [row for rows in adapt_with(name, fold_tasks) for row in rows]
        scores[name] = Score.of(predictions, clock() - start)
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


__all__ = ["DEFAULT_FOLDS", "MIN_FOLDS", "Comparison", "Score", "below_base", "choose", "cross_validate",
           "fold_count", "folds", "most_folds"]
