"""A metric is one registered object: a toy metric registered here, and nowhere else, is carried
by the records and shows up in the summary, the comparisons, the markdown report, eval.json, the
tracker's rows and a study's objective; the registered ones keep their computation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import torch
from eval_helpers import PAD, VOCAB, tiny_lora_llama

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.errors import UserInputError
from fmmeta.evaluation import EpisodeRecord, EvalResult
from fmmeta.evaluation.metrics import METRICS, Metric, get_metric, metrics_of, register_metric
from fmmeta.evaluation.report import format_markdown, write_report
from fmmeta.evaluation.scoring import QueryScore, score_query
from fmmeta.tasks.episode import Episode, Example

TOY = "error_rate"


@pytest.fixture
def toy() -> Iterator[Metric]:
    """``error_rate``: the fraction of queries answered wrongly (lower is better), from the
    per-query correctness scoring already produces; unregistered after the test."""
    metric = register_metric(Metric(
        name=TOY, compute=lambda s: 1.0 - sum(s.correct) / len(s.correct), higher_is_better=False,
        description="fraction of queries answered wrongly"))
    try:
        yield metric
    finally:
        METRICS.pop(TOY, None)


def test_the_registered_metrics_keep_their_computation() -> None:
    assert list(METRICS)[:3] == ["accuracy", "loss", "accuracy_per_token"]
    score = QueryScore(loss=1.25, accuracy=0.5, n=2, accuracy_per_token=1.0, correct=(True, False))
    assert metrics_of(score, "classification") == {"accuracy": 0.5, "loss": 1.25}
    assert metrics_of(score, "multiple_choice") == {"accuracy": 0.5, "loss": 1.25, "accuracy_per_token": 1.0}
    assert get_metric("loss").direction == "minimize" and get_metric("accuracy").worst([0.2, 0.7]) == 0.2
    with pytest.raises(KeyError, match="did you mean 'accuracy'"):
        get_metric("acuracy")
    with pytest.raises(ValueError, match="registered already"):
        register_metric(Metric(name="loss", compute=lambda s: s.loss, higher_is_better=False))
    with pytest.raises(ValueError, match="kinds"):
        register_metric(Metric(name="x", compute=lambda s: s.loss, higher_is_better=False, kinds=frozenset({"poem"})))


def test_a_scored_query_set_holds_what_a_metric_of_its_queries_needs(toy: Metric) -> None:
    b = torch.zeros(VOCAB)
    b[7], b[8] = 5.0, 5.0
    model = tiny_lora_llama(lm_bias=b)
    choices = ((5,), (7, 8))
    query = tuple(Example((10 + i, 11 + i), choices[lab], lab) for i, lab in enumerate([1, 0, 1]))
    score = score_query(model, Episode("cls", (), query, shots=1, ways=2, choices=choices), PAD)
    assert score.correct == (True, False, True) and score.accuracy == pytest.approx(2 / 3)
    assert -sum(score.gold_logprob) / score.n_answer_tokens == pytest.approx(score.loss, rel=1e-6)
    assert metrics_of(score, "classification")[TOY] == pytest.approx(1 / 3)


def _result() -> EvalResult:
    """Two methods on the same episodes, every record carrying the toy metric (as
    :func:`metrics_of` gives it once registered)."""
    records = []
    for method, better in (("multitask", 0.0), ("fomaml", 0.25)):
        for seed in range(3):
            for e in range(4):
                acc = min(1.0, 0.25 * (e % 3) + better)
                records.append(EpisodeRecord(
                    method=method, seed=seed, episode=e, task=f"t{e % 2}", kind="classification", step=1, n=4,
                    chance=0.5, metrics={"accuracy": acc, "loss": 2.0 - acc, TOY: 1.0 - acc}))
    return EvalResult(records=records, methods=["multitask", "fomaml"], max_steps=1, n_seeds=3,
                      inner_lrs={}, inner=InnerLoopConfig())


def test_a_registered_metric_is_summarised_compared_and_reported(toy: Metric, tmp_path: Path) -> None:
    from fmmeta.tracking.records import evaluation_rows

    result = _result()
    cell = result.get("fomaml", 1)
    assert cell.mean(TOY) == pytest.approx(1.0 - cell.mean("accuracy"))
    assert cell.worst(TOY) == pytest.approx(1.0 - cell.worst("accuracy"))  # the highest error, the lowest accuracy
    c = result.compare("fomaml", "multitask")
    assert c is not None and c.interval(TOY).estimate == pytest.approx(-c.interval("accuracy").estimate)
    md = format_markdown(result)
    assert f"## overall: query {TOY} (12 episodes)" in md and f"## classification: query {TOY}" in md
    assert f"{TOY} vs multitask" in md and "fraction of queries answered wrongly" in md
    paths = write_report(result, tmp_path / "eval")
    data = json.loads(paths["eval.json"].read_text())
    assert data["summary"]["fomaml"]["overall"]["1"][f"{TOY}_mean"] == pytest.approx(cell.mean(TOY))
    assert data["comparisons"][0][TOY]["estimate"] == pytest.approx(c.interval(TOY).estimate)
    assert EvalResult.from_dict(data).records == result.records
    row = evaluation_rows(paths["eval.json"])[0]
    assert {TOY, f"{TOY}_low", f"{TOY}_high", f"{TOY}_worst_seed"} <= set(row)


def test_a_metric_of_one_kind_is_summarised_where_every_episode_has_it() -> None:
    records = [EpisodeRecord(method="base", seed=0, episode=e, task=kind, kind=kind, step=0, n=2,
                             metrics=metrics_of(QueryScore(loss=1.0, accuracy=0.5, n=2, accuracy_per_token=0.5),
                                                kind))
               for e, kind in enumerate(("multiple_choice", "generation"))]
    summary = EvalResult(records=records, methods=["base"], max_steps=0, n_seeds=1, inner_lrs={},
                         inner=InnerLoopConfig()).summary()["base"]
    assert "accuracy_per_token" in summary["multiple_choice"][0].metrics
    assert list(summary["overall"][0].metrics) == ["accuracy", "loss"]


def test_a_registered_metric_is_a_study_objective(toy: Metric, tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    from fmmeta.study import StudyConfig
    from fmmeta.study.config import MethodSpace
    from fmmeta.study.report import choose, format_study
    from fmmeta.study.scoring import score_of, standard_error_of
    from fmmeta.study.search import open_study

    study = StudyConfig(output_dir=str(tmp_path), space={"fomaml": MethodSpace()}, metric=TOY)
    assert not [p for p in study.validate() if "metric" in p]
    assert any("metric='nope'" in p for p in StudyConfig(space={"fomaml": MethodSpace()}, metric="nope").validate())
    assert open_study(optuna, tmp_path, "fomaml", study).direction == optuna.study.StudyDirection.MINIMIZE
    result = _result()
    assert score_of(result, "fomaml", TOY, "overall") == pytest.approx(result.get("fomaml", 1).mean(TOY))
    assert standard_error_of(result, "fomaml", TOY, "overall") > 0
    with pytest.raises(UserInputError, match="accuracy_per_token.*multiple_choice"):
        score_of(result, "fomaml", "accuracy_per_token", "overall")  # classification episodes: not defined
    rows = [{"folder": f"trial_00{i}", "value": v, "state": "complete", "params": {}, "curve": {}} for i, v in enumerate((0.4, 0.2))]
    chosen = choose("fomaml", rows, study)
    assert chosen["folder"] == "trial_001" and chosen["why"].startswith(f"trial_001: lowest mean validation {TOY}")
    held_out = json.loads(json.dumps(result.to_dict()))
    md = format_study({"study": {"config": None, "overrides": [], "metric": TOY, "family": "overall", "seeds": 3,
                                 "episodes_per_task": 1}, "held_out_tasks": ["t0", "t1"],
                       "trials": {"fomaml": rows}, "choice": {"fomaml": chosen}, "held_out": held_out})
    assert f"| method | step | {TOY} | worst seed | accuracy | loss |" in md
    assert f"| paired difference | {TOY} | replicates for / against | accuracy | loss |" in md
