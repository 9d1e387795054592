"""scripts/compare_rows.py: rows scored in separate evaluate calls pool into the very paired
difference one call would give, and files that drew other episodes are refused."""

from __future__ import annotations

import dataclasses
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
    return [EpisodeRecord(method=method, seed=s, episode=e, task=tasks[e], kind="classification",
                          step=2, metrics={"loss": 1.0 + 0.1 * e - shift, "accuracy": (s + e) % 3 / 3 + shift}, n=6)
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
    assert got == expected and got.interval("accuracy").estimate == pytest.approx(0.1)


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


# Records as eval.json held them before the rename: "family" was the kind, "domain" the suite
# family. Copied from docs/research/step_size_sweep/held_out/eval.json (4 of its 240 records).
OLD_RECORDS = [
    {"method": "base", "seed": 0, "episode": 0, "task": "translate-ro", "family": "generation", "step": 6,
     "loss": 4.868045330047607, "accuracy": 0.1666666716337204, "n": 6, "domain": "cldr-translation"},
    {"method": "base", "seed": 0, "episode": 5, "task": "langid-ro-ga-uk", "family": "classification",
     "step": 6, "loss": 5.059190273284912, "accuracy": 0.2777777910232544, "n": 18, "domain": "cldr-langid"},
    {"method": "multitask", "seed": 0, "episode": 0, "task": "translate-ro", "family": "generation", "step": 6,
     "loss": 3.4792919158935547, "accuracy": 0.5, "n": 6, "domain": "cldr-translation"},
    {"method": "multitask", "seed": 0, "episode": 5, "task": "langid-ro-ga-uk", "family": "classification",
     "step": 6, "loss": 0.4704759418964386, "accuracy": 1.0, "n": 18, "domain": "cldr-langid"},
]  # fmt: skip


def test_a_record_of_the_old_layout_loads_with_its_kind_and_family() -> None:
    rec = EpisodeRecord.from_dict(OLD_RECORDS[1])
    assert rec == EpisodeRecord(method="base", seed=0, episode=5, task="langid-ro-ga-uk",
                                kind="classification", step=6, n=18, family="cldr-langid",
                                metrics={"loss": 5.059190273284912, "accuracy": 0.2777777910232544})
    # older still: no suite family at all
    no_family = {k: v for k, v in OLD_RECORDS[0].items() if k != "domain"}
    oldest = EpisodeRecord.from_dict(no_family)
    assert (oldest.kind, oldest.family) == ("generation", "")
    # today's layout reads back as written
    new = _records("m", 0.0, ["a"])[0]
    assert EpisodeRecord.from_dict(json.loads(json.dumps(dataclasses.asdict(new)))) == new
    assert "kind" in EvalResult(records=[new], methods=["m"], max_steps=2, n_seeds=1, inner_lrs={},
                                inner=InnerLoopConfig()).to_dict()["records"][0]


def test_an_old_eval_json_pools_with_the_same_summary_keys(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"methods": ["base", "multitask"], "max_steps": 6, "n_seeds": 3,
                               "records": OLD_RECORDS}))
    pooled = _script().pooled_result([old])
    assert pooled.families() == ["classification", "generation", "cldr-langid", "cldr-translation", "overall"]
    assert pooled.get("multitask", 6, "cldr-langid").mean("accuracy") == 1.0
    assert pooled.get("base", 6, "generation").n_episodes == 1


def test_the_committed_research_eval_jsons_still_read() -> None:
    """docs/research/ keeps eval.json files of the old layout; they must stay readable."""
    files = sorted((SCRIPT.parents[1] / "docs" / "research").glob("**/eval.json"))
    assert files
    for path in files:
        raw = json.loads(path.read_text())["records"]
        records = [EpisodeRecord.from_dict(r) for r in raw]
        want = [(r["kind"], r["family"]) if "kind" in r else (r["family"], r.get("domain", "")) for r in raw]
        assert [(r.kind, r.family) for r in records] == want
        assert {r.kind for r in records} <= {"classification", "generation"}
