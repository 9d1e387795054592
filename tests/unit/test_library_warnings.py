"""Library warnings once per run: two processes set up logging as ``recipes/train.py`` does (rank 0
and rank 1), then hit the same library warnings; the combined output shows each once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import importlib.util, logging, sys, warnings
spec = importlib.util.spec_from_file_location("train_recipe", sys.argv[2])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
rank = int(sys.argv[1])
train.setup_logging(rank)
for _ in range(3):  # the same place warns on every call, as a library does in a loop
    warnings.warn("old_api is deprecated", FutureWarning)
    with warnings.catch_warnings():  # resets Python's memory of what it showed (torch does this)
        pass
logging.getLogger("transformers.modeling_utils").warning("a library logger warning")
logging.getLogger("fmmeta.train").warning("rank %d has something to say", rank)
logging.getLogger("torch.distributed").error("a library error")
"""


def test_library_warnings_show_once_over_two_ranks() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": ""}
    procs = [subprocess.run([sys.executable, "-c", WORKER, str(rank), str(ROOT / "recipes" / "train.py")],
                            env=env, capture_output=True, text=True, timeout=120) for rank in (0, 1)]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    out = "".join(p.stdout + p.stderr for p in procs)
    assert out.count("old_api is deprecated") == 1, out
    assert "[rank0] WARNING py.warnings:" in out  # through logging, naming its rank
    assert out.count("a library logger warning") == 1, out
    # fmmeta's own warnings and every error still show on every rank.
    assert "rank 0 has something to say" in out and "rank 1 has something to say" in out
    assert out.count("a library error") == 2, out


PEFT_WRAP = r"""
import logging, sys, warnings
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM
from fmmeta.library_warnings import show_library_warnings_once
logging.basicConfig(level=logging.INFO, force=True)  # as fmmeta adapt sets it up
show_library_warnings_once(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2))
model.is_gradient_checkpointing  # transformers' own deprecation, the line peft's wrapper runs into
model.name_or_path = sys.argv[1]  # a base model folder without config.json, as the embedded GGUF's
peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
peft_model.save_pretrained(sys.argv[2])  # peft cannot tell whether the vocabulary was resized
import torch, torch.distributed as dist  # the collectives DeepSpeed's ZeRO stages call
dist.init_process_group("gloo", init_method="file://" + sys.argv[2] + "/store", rank=0, world_size=1)
dist.all_gather_into_tensor(torch.zeros(2), torch.ones(2))
dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2))
dist.destroy_process_group()
warnings.warn("another library's deprecation", FutureWarning)
"""


def test_warnings_no_user_can_act_on_are_not_shown(tmp_path: Path) -> None:
    """transformers' deprecation of ``is_gradient_checkpointing``, which peft's wrapper reads,
    peft's guess about a vocabulary fmmeta never resizes and torch's deprecation of the
    collectives DeepSpeed calls are dropped
    (:data:`fmmeta.library_warnings.NOT_ACTIONABLE`); other library warnings still show."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "", "HF_HUB_OFFLINE": "1"}
    (tmp_path / "base").mkdir()
    proc = subprocess.run([sys.executable, "-c", PEFT_WRAP, str(tmp_path / "base"), str(tmp_path / "adapter")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert "is_gradient_checkpointing" not in proc.stderr, proc.stderr
    assert "Could not find a config file" not in proc.stderr, proc.stderr
    assert "all_gather_into_tensor" not in proc.stderr and "reduce_scatter_tensor" not in proc.stderr, proc.stderr
    assert "another library's deprecation" in proc.stderr
