"""scripts/compare_rows.py: rows scored in separate evaluate calls pool into the very paired
difference one call would give, and files that drew other episodes are refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.evaluation.result import EpisodeRecord, EvalResult

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "compare_rows.py"


def _script():
    spec = importlib.util.spec_from_file_location("compare_rows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records(method: str, shift: float, tasks: list[str]) -> list[EpisodeRecord]:
    return [EpisodeRecord(method=method, seed=s, episode=e, task=tasks[e], family="classification",
                          step=2, loss=1.0 + 0.1 * e - shift, accuracy=(s + e) % 3 / 3 + shift, n=6)
            for s in range(3) for e in range(len(tasks))]


def _eval_json(path: Path, records: list[EpisodeRecord]) -> Path:
    result = EvalResult(records=records, methods=sorted({r.method for r in records}), max_steps=2,
                        n_seeds=3, inner_lrs={}, inner=InnerLoopConfig())
    path.write_text(json.dumps(result.to_dict()))
    return path


def test_pooled_files_give_the_single_call_difference(tmp_path: Path) -> None:
    tasks = ["a", "a", "b", "b"]
    a, b = _records("reptile@40", 0.1, tasks), _records("multitask@40", 0.0, tasks)
    one_call = EvalResult(records=a + b, methods=["reptile@40", "multitask@40"], max_steps=2,
                          n_seeds=3, inner_lrs={}, inner=InnerLoopConfig())
    pooled = _script().pooled_result([_eval_json(tmp_path / "1.json", a),
                                      _eval_json(tmp_path / "2.json", b + a)])  # a row twice: kept once
    assert len(pooled.records) == len(a) + len(b)
    expected = one_call.compare("reptile@40", "multitask@40", "classification")
    got = pooled.compare("reptile@40", "multitask@40", "classification")
    assert got == expected and got.accuracy.estimate == pytest.approx(0.1)


def test_files_with_other_episodes_are_refused(tmp_path: Path) -> None:
    one = _eval_json(tmp_path / "1.json", _records("reptile@40", 0.1, ["a", "b"]))
    other = _eval_json(tmp_path / "2.json", _records("multitask@40", 0.0, ["b", "a"]))
    with pytest.raises(ValueError, match="not the same episodes"):
        _script().pooled_result([one, other])


def test_a_suffix_pairs_two_runs_rows_of_one_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tasks = ["a", "a", "b", "b"]
    fp32 = _eval_json(tmp_path / "fp32.json", _records("fomaml", 0.0, tasks))
    bf16 = _eval_json(tmp_path / "bf16.json", _records("fomaml", 0.1, tasks))
    assert _script().main([str(fp32), f"{bf16}=@bf16", "--pair", "fomaml@bf16:fomaml"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    diff = out["classification"]["pairs"]["fomaml@bf16:fomaml"]["accuracy"]
    assert diff["estimate"] == pytest.approx(0.1)
    assert set(out["classification"]["rows"]) == {"fomaml", "fomaml@bf16"}
