"""What a checkpoint's state means, and the check that a resuming run means the same.

A checkpoint holds an adapter, an outer optimizer state, a sampler state and RNG streams. Each is
only meaningful under the settings that produced it: a Reptile run continuing a FOMAML adapter, an
adapter scaled by another ``lora.alpha``, Adam moments under another ``outer_lr`` schedule or a
sampler state of another strategy would all run without an error and quietly train something
else. So every checkpoint records those settings (:func:`resume_facts`), and a resume compares
them with the new run's before anything is loaded or written (:func:`resume_differences`).

Settings that change only speed or bookkeeping (pass packing, the cost model, logging,
checkpoint cadence, ``meta_steps``, evaluation) are free to change between a run and its resume.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from fmmeta.checkpoint.manager import Checkpoint, CheckpointError, CheckpointManager
from fmmeta.config import to_dict
from fmmeta.errors import UserInputError

__all__ = ["ADAPTER_KEYS", "DATA_FINGERPRINT", "RESUME_FACTS", "RESUME_KEYS", "adapter_problems", "check_task_pool",
           "facts_checkpoint", "find_resume_checkpoint", "resume_differences", "resume_facts", "resume_problems"]

RESUME_FACTS = "resume_facts"
"""The manifest ``meta`` entry that holds :func:`resume_facts`."""

RESUME_KEYS: tuple[str, ...] = (
    "algorithm.name", "algorithm.inner_steps", "algorithm.inner_lr", "algorithm.inner_optimizer",
    "algorithm.inner_clip_norm",
    "algorithm.icl_max_length", "algorithm.inner_format",
    "model.name_or_path", "model.gguf_file", "model.tiny", "model.tiny_vocab_size",
    "model.tiny_hidden_size", "model.tiny_intermediate_size", "model.tiny_num_layers",
    "model.tiny_num_heads", "model.tiny_num_kv_heads", "model.tiny_max_positions",
    "model.tiny_seed", "model.dtype", "model.tokenizer",
    "lora.r", "lora.alpha", "lora.dropout", "lora.target_modules",
    "optim.outer_lr", "optim.weight_decay", "optim.betas", "optim.eps", "optim.grad_clip",
    "optim.warmup_steps", "optim.schedule", "optim.total_steps",
    "sampler.meta_batch_size", "sampler.strategy", "sampler.on_uneven", "sampler.difficulty",
    "sampler.pacing_start", "sampler.pacing_steps", "sampler.pacing", "sampler.hard_floor",
    "sampler.hard_temperature", "sampler.difficulty_bins", "sampler.loss_ema",
    "train.seed", "tasks.seed",
)
"""Dotted config keys whose value a checkpoint's state depends on (``algorithm.name`` is the
method the checkpoint was trained with)."""


ADAPTER_KEYS: tuple[str, ...] = tuple(
    k for k in RESUME_KEYS if k.startswith(("model.", "lora.")) and k != "model.dtype"
)
"""The keys a saved adapter means something only under: the base model and the LoRA shape and
scale. Evaluating it under others loads the wrong tensors or scales them wrongly (``lora.alpha``
would pass without an error); the precision may change (a run made on a CPU is evaluated on a GPU)."""


def resume_facts(cfg: Any, method: str) -> dict[str, Any]:
    """The values of :data:`RESUME_KEYS` for ``method`` in ``cfg``, and its own section
    ``algorithm.<method>`` (``None`` where it has none), JSON-able, for the manifest."""
    tree = to_dict(cfg)
    tree.setdefault("algorithm", {})["name"] = method
    facts: dict[str, Any] = {}
    for key in (*RESUME_KEYS, f"algorithm.{method}"):  # the method's own section, where it has one
        node: Any = tree
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        facts[key] = node
    return facts


def resume_differences(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, allowed: Iterable[str] = ()
) -> list[str]:
    """One line per key whose value differs, ``"key: <saved> in the checkpoint, <current> now"``.

    Keys listed in ``allowed`` (``train.resume_changes``) may differ; keys a checkpoint predates
    (absent from ``saved``) are not compared.
    """
    free = set(allowed)
    lines = []
    for key, now in current.items():
        if key in free or key not in saved:
            continue
        then = saved[key]
        if _plain(then) != _plain(now):
            lines.append(f"{key}: {then!r} in the checkpoint, {now!r} now")
    return lines


def _plain(value: Any) -> Any:
    """Tuples and lists compare equal (a manifest stores JSON lists)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def find_resume_checkpoint(train: Any, method_dir: Path) -> Checkpoint | None:
    """The checkpoint ``train.resume`` selects for one method's folder, or None to start fresh.

    Raises:
        CheckpointError: ``train.resume`` names a folder that is not a complete checkpoint.
    """
    if train.resume == "never":
        return None
    ckpts = CheckpointManager(method_dir / "checkpoints", keep_last=max(2, train.keep_last))
    return ckpts.latest() if train.resume == "auto" else ckpts.open(Path(train.resume).expanduser())


def _unusable_problem(cfg: Any, output_dir: Path, method: str) -> list[str]:
    """A refusal when ``method`` has checkpoint folders of which none verifies, or a finished
    adapter and no checkpoint at all: starting it from step 0 would overwrite its adapter,
    checkpoints and metrics (a half-written manifest after a crash or a full disk, or checkpoints
    deleted to free disk, must not cost a finished run)."""
    method_dir = output_dir / method
    ckpts = CheckpointManager(method_dir / "checkpoints", keep_last=max(2, cfg.train.keep_last))
    found = ckpts.step_folders()
    adapter = method_dir / "adapter" / "adapter_model.safetensors"
    if not found and adapter.is_file():
        # Its checkpoints were deleted (to free disk): step 0 would train over a finished adapter.
        return [
            f"{method}: its adapter {str(adapter.parent)!r} is finished but it has no checkpoint to "
            "resume from (were its checkpoints deleted?), so this run would train it again from "
            "step 0 over that adapter and its metrics. To keep it, leave it out of methods (or "
            "copy the run folder first); to train it again, rerun with train.resume=never or "
            "another output_dir"
        ]
    if not found:
        return []
    why = "; ".join(f"{p.name}: {(ckpts.verify(p) or ['unreadable'])[0]}" for p in found[:3])
    intact = [str(p) for p in (method_dir / "adapter", output_dir / "metrics.jsonl",
                               output_dir / "eval") if p.exists()]
    return [
        f"{method}: {len(found)} checkpoint folder(s) in {str(method_dir / 'checkpoints')!r} and "
        f"none verifies ({why}), so it cannot resume, and starting it from step 0 would "
        f"overwrite what is there (intact: {', '.join(intact) or 'nothing else'}). To start "
        "over, rerun with train.resume=never (its checkpoints, adapter and metrics are then "
        "written anew) or with a new output_dir"
    ]


def resume_problems(cfg: Any, output_dir: Path) -> list[str]:
    """Every reason the run ``cfg`` may not resume what ``train.resume`` selects, one per method.

    Checked on rank 0 before anything is written into ``output_dir``, so a refused resume leaves
    the folder as it was.
    """
    problems = [
        f"train.resume_changes names {key!r}, which is not a setting a checkpoint depends on"
        + (f"; did you mean {close[0]!r}?" if (close := difflib.get_close_matches(key, RESUME_KEYS, 1))
           else f" (those are: {', '.join(RESUME_KEYS)})")
        for key in cfg.train.resume_changes if key not in RESUME_KEYS
    ]
    problems.extend(_layout_problems(cfg, output_dir))
    problems.extend(_edited_config_problems(cfg, output_dir))
    replicates = cfg.replicate_configs()
    for replicate in replicates:
        folder = output_dir if len(replicates) == 1 else output_dir / Path(replicate.output_dir).name
        problems.extend(_method_problems(replicate, folder))
    return problems


def _method_problems(cfg: Any, output_dir: Path) -> list[str]:
    """The resume refusals of one replicate's methods (``cfg``: that replicate's config)."""
    problems = []
    for method in cfg.methods:
        try:
            ckpt = find_resume_checkpoint(cfg.train, output_dir / method)
        except CheckpointError as err:
            problems.append(f"{method}: {err}")
            continue
        if ckpt is None and cfg.train.resume == "auto":
            problems.extend(_unusable_problem(cfg, output_dir, method))
        if ckpt is None or RESUME_FACTS not in ckpt.meta:
            continue  # nothing to resume, or a checkpoint written before the facts were recorded
        diffs = resume_differences(ckpt.meta[RESUME_FACTS], resume_facts(cfg, method),
                                   allowed=cfg.train.resume_changes)
        if diffs:
            problems.append(_changed_settings(
                f"{method} would resume from {str(ckpt.path)!r}", diffs,
                "start afresh (train.resume=never or another output_dir)"))
    return problems


DATA_FINGERPRINT = "data_fingerprint"
"""The manifest ``meta`` entry that holds the meta-training data's fingerprint
(:func:`fmmeta.tasks.task.tasks_fingerprint`)."""


def check_task_pool(cfg: Any, task_names: list[str], fingerprint: str) -> None:
    """Refuses a resume whose checkpoint was trained on other meta-training data: a task removed
    from, or added to, the data between a run and its extension (the sampler would refuse only
    once the run folder was rewritten), or the same tasks with other examples (nothing refused
    that: the run trained on), before the run writes anything.

    ``task_names``: the meta-training tasks as the run built them, in order; ``fingerprint``:
    theirs (:data:`DATA_FINGERPRINT`). The sampler's state is the recipe's ``state.json``
    ``prefetcher.sampler.task_names``. Call it on every rank.

    Raises:
        UserInputError: naming each method, its checkpoint and what differs.
    """
    problems = []
    for replicate in cfg.replicate_configs():
        for method in cfg.methods:
            try:
                ckpt = find_resume_checkpoint(replicate.train, Path(replicate.output_dir).expanduser() / method)
                if ckpt is None:
                    continue
                saved: list[str] = list(ckpt.load_json("state.json")["prefetcher"]["sampler"]["task_names"])
            except (CheckpointError, KeyError, TypeError):
                continue  # refused as a resume problem, or a state from before this layout
            if saved == task_names:
                then = ckpt.meta.get(DATA_FINGERPRINT, fingerprint)  # absent: written before it was recorded
                if then != fingerprint:
                    problems.append(f"{method} would resume from {str(ckpt.path)!r}, trained on the same tasks "
                                    "with other examples (their tokens differ: data edited, or another "
                                    "tokenizer or tasks.max_length)")
                continue
            gone, new = sorted(set(saved) - set(task_names)), sorted(set(task_names) - set(saved))
            what = "; ".join([*([f"gone: {gone}"] if gone else []), *([f"new: {new}"] if new else [])]) or "reordered"
            problems.append(f"{method} would resume from {str(ckpt.path)!r}, whose sampler was saved over "
                            f"another meta-training pool ({what})")
    if problems:
        raise UserInputError(
            "the meta-training data changed since the checkpoints were written; nothing was written:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nPut the data back as it was to resume, or start afresh (train.resume=never or another output_dir)"
        )


def _edited_config_problems(cfg: Any, output_dir: Path) -> list[str]:
    """A refusal when the run folder's ``config.yaml`` disagrees with what its checkpoints were
    made with: it was edited by hand after the run wrote it, and this run would overwrite the
    edit without a word (and train on with the checkpoints' values)."""
    path = output_dir / "config.yaml"
    if cfg.train.resume != "auto" or not path.is_file():
        return []
    from fmmeta.config import ConfigError, load_config

    try:
        saved = load_config(type(cfg), path, [])
    except ConfigError as err:
        return [f"{str(path)!r} no longer reads as the run's config ({err.problems[0]}): it was edited after "
                "the run wrote it; put it back (the checkpoints record what the run used) or give this run "
                "another output_dir"]
    if saved.train.replicates != cfg.train.replicates:
        return []  # said by _layout_problems
    lines = []
    for then, now in zip(saved.replicate_configs(), cfg.replicate_configs()):
        folder = output_dir if saved.train.replicates == 1 else output_dir / Path(then.output_dir).name
        for method in cfg.methods:
            try:
                ckpt = find_resume_checkpoint(now.train, folder / method)
            except CheckpointError:
                continue  # said by _method_problems
            if ckpt is None or RESUME_FACTS not in ckpt.meta or method not in saved.methods:
                continue
            # A change the earlier run accepted (train.resume_changes) is in the file before its checkpoint.
            diffs = resume_differences(ckpt.meta[RESUME_FACTS], resume_facts(then, method),
                                       allowed=(*saved.train.resume_changes, *cfg.train.resume_changes))
            lines += [f"{method}: {d.replace(' now', f' in {path.name}')}" for d in diffs]
    if not lines:
        return []
    return [f"{str(path)!r} disagrees with the run's checkpoints, so it was edited after the run wrote it "
            f"({'; '.join(dict.fromkeys(lines))}). This run would overwrite the edit and train on with the "
            "checkpoints' values: put the file back, or give the changed run another output_dir"]


def _layout_problems(cfg: Any, output_dir: Path) -> list[str]:
    """A refusal when ``output_dir`` holds a run of another ``train.replicates``: one replicate
    trains into the folder itself, several into ``replicate_<r>`` folders, so the new run would
    start afresh beside what is there instead of resuming it."""
    if not output_dir.is_dir():
        return []
    several = sorted(p.name for p in output_dir.glob("replicate_*") if p.is_dir())
    flat = sorted(m for m in cfg.methods if (output_dir / m / "checkpoints").is_dir()
                  or (output_dir / m / "adapter").is_dir())
    found = (f"training replicates ({', '.join(several)})" if several and cfg.train.replicates == 1
             else f"a one-replicate run's {', '.join(flat)}" if flat and cfg.train.replicates > 1 else None)
    if found is None:
        return []
    return [f"train.replicates={cfg.train.replicates}, but {str(output_dir)!r} holds {found}: "
            "a run keeps its number of replicates. Rerun with the run's train.replicates (its "
            "config.yaml), or give this run another output_dir"]


def _changed_settings(what: str, diffs: list[str], afresh: str, *, acceptable: bool = True) -> str:
    """The one wording of a refusal for changed settings, in training and evaluation alike
    (``acceptable``: whether ``train.resume_changes`` may accept the change)."""
    keys = ", ".join(d.split(":")[0] for d in diffs)
    return (
        f"{what}, whose state was made with other settings: {'; '.join(diffs)}. Rerun with the "
        f"checkpoint's values" + (f", {afresh}, or accept the change with train.resume_changes=[{keys}]"
                                  if acceptable else f" or {afresh}")
    )


def facts_checkpoint(cfg: Any, run_dir: Path, method: str) -> Checkpoint | None:
    """The method's newest verified checkpoint that records the settings it was made with."""
    ckpts = CheckpointManager(run_dir / method / "checkpoints", keep_last=max(2, cfg.train.keep_last))
    ckpt = ckpts.latest() if ckpts.root.is_dir() else None
    return None if ckpt is None or RESUME_FACTS not in ckpt.meta else ckpt  # older ones predate the facts


def adapter_problems(cfg: Any, run_dir: Path, methods: Iterable[str],
                     saved: Callable[[], Any]) -> list[str]:
    """Every reason the adapters of ``methods`` in the run ``run_dir`` cannot be evaluated under
    ``cfg`` (``evaluate --run`` with overrides): one per method whose :data:`ADAPTER_KEYS` differ.

    The settings an adapter was made with are its newest verified checkpoint's (as a resume
    reads them), or those of ``saved()`` (the run's own config, loaded only when needed) for a
    method without one. ``train.resume_changes`` does not apply: an adapter evaluated under
    another LoRA shape or base cannot even be loaded, and under another scale it is another model.
    """
    problems = []
    for method in methods:
        ckpt = facts_checkpoint(cfg, run_dir, method)
        if ckpt is not None:
            then, source = ckpt.meta[RESUME_FACTS], f"checkpoint {str(ckpt.path)!r}"
        else:
            then, source = resume_facts(saved(), method), f"{str(run_dir / 'config.yaml')!r}"
        now = {k: v for k, v in resume_facts(cfg, method).items() if k in ADAPTER_KEYS}
        diffs = resume_differences(then, now)
        if ckpt is None:
            diffs = [d.replace(" in the checkpoint,", " in the run's config.yaml,") for d in diffs]
        if diffs:
            problems.append(_changed_settings(
                f"{method}'s adapter would be evaluated as trained from {source}", diffs,
                "evaluate it with --config and --adapter NAME=PATH", acceptable=False))
    return problems
