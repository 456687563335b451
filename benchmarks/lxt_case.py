"""Hand a model and inputs to lxt 2.1 in its own venv (benchmarks/lxt_worker.py) and read its relevances back.

lxt 2.1 needs transformers 4.x, attnaudit has 5.x, so the two never share a process: :func:`write_case`
saves the weights (safetensors) and the architecture as the keyword arguments of the transformers 4
config (BERT sequence classifiers and Llama causal LMs, the two families compared), and :func:`run_lxt`
runs the worker with the lxt venv's python. The venv is ``$ATTNAUDIT_LXT_VENV`` (default
``/tmp/lxt-venv``), built by ``benchmarks/lxt_venv.sh DIR``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from attnaudit.models.hf import HFModel

WORKER = Path(__file__).with_name("lxt_worker.py")
LXT_VENV = Path(os.environ.get("ATTNAUDIT_LXT_VENV", "/tmp/lxt-venv"))
LXT_INSTALL = "benchmarks/lxt_venv.sh /tmp/lxt-venv  (or set ATTNAUDIT_LXT_VENV to such a venv)"


def lxt_python() -> Path | None:
    """The lxt venv's python, or None when the venv (with lxt installed) is absent."""
    python = LXT_VENV / "bin" / "python"
    found = list((LXT_VENV / "lib").glob("python*/site-packages/lxt/efficient")) if python.exists() else []
    return python if found else None


def family_config(model: HFModel) -> tuple[str, dict[str, Any]]:
    """``("bert" | "llama", transformers-4 config kwargs)`` of a wrapped BERT classifier or Llama LM."""
    cfg = model.hf.config
    common = {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "intermediate_size", "max_position_embeddings")}
    if cfg.model_type == "bert":
        extra = {k: getattr(cfg, k) for k in ("type_vocab_size", "layer_norm_eps", "hidden_act", "pad_token_id")}
        return "bert", {**common, **extra, "num_labels": int(cfg.num_labels)}
    if cfg.model_type == "llama":
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        extra = {k: getattr(cfg, k) for k in ("num_key_value_heads", "rms_norm_eps", "tie_word_embeddings", "attention_bias",
                                              "mlp_bias", "head_dim", "hidden_act")}
        return "llama", {**common, **extra, "rope_theta": float(theta)}
    raise ValueError(f"lxt comparison covers BERT and Llama, not {cfg.model_type}")


def write_case(model: HFModel, inputs: list[list[int]], rule: str, folder: Path, threads: int = 1) -> Path:
    """Save ``model``'s weights and architecture and the token ids of each input for the worker."""
    folder.mkdir(parents=True, exist_ok=True)
    family, config = family_config(model)
    dtype = str(next(model.hf.parameters()).dtype).removeprefix("torch.")
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.hf.state_dict().items()}
    save_file(state, str(folder / "weights.safetensors"))
    verbalizer = getattr(model, "verbalizer_ids", None)
    case = {"family": family, "config": config, "rule": rule, "inputs": inputs, "dtype": dtype, "threads": threads,
            "verbalizer": None if verbalizer is None else verbalizer.tolist()}
    (folder / "case.json").write_text(json.dumps(case))
    return folder


def run_lxt(folder: Path, repeats: int = 1, timeout: float = 1800) -> dict[str, Any]:
    """Run the worker on a case folder with the lxt venv's python; its JSON answer."""
    python = lxt_python()
    if python is None:
        raise FileNotFoundError(f"no lxt venv at {LXT_VENV}; build it with {LXT_INSTALL}")
    out = folder / "lxt.json"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": ""}
    subprocess.run([str(python), str(WORKER), str(folder), str(out), "--repeats", str(repeats)],
                   check=True, env=env, timeout=timeout, capture_output=True, text=True)
    return json.loads(out.read_text())


def real_ids(batch: Any) -> list[list[int]]:
    """Each example's token ids without padding."""
    return [row[m].tolist() for row, m in zip(batch.tokens, batch.mask.bool())]


def as_tensor(rows: list[list[float]], width: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Ragged rows right-padded with 0 to ``width``."""
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out
