"""Hugging Face models as attnaudit runs: build, load and save an encoder, a decoder-only model or an encoder-decoder.

One adapter serves every architecture (:class:`~attnaudit.models.hf.model.HFModel`, loaded by
:func:`~attnaudit.models.hf.loading.build_hf_model`); this module wraps it in a
:class:`~attnaudit.run.Run` with the right batches; ``load_run`` reaches :func:`load_hf_run` for
runs of kind ``hf``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from attnaudit.data.types import TaskData
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.models.hf import (
    DTYPES,
    HF_DIR,
    Chat,
    HFCollator,
    HFModel,
    ZeroShotCollator,
    build_hf_model,
    check_chat_options,
    check_chat_template,
    derive_zero_shot,
    make_zero_shot,
    quiet_transformers,
    resolve_zero_shot,
    seq2seq_collator,
)
from attnaudit.options import check_devices, check_dtype, check_max_length, parse_device_map, parse_max_memory
from attnaudit.pretrained import resolve_source
from attnaudit.run import Run, TaskSpec, absolute_dir, read_config, write_config

# Callers name the model classes and sources from here, the one entry to Hugging Face models.
__all__ = ["HFModel", "HFCollator", "build_hf_model", "load_hf", "load_hf_run", "resolve_source", "save_hf_run"]


def _make_run(
    model: HFModel, spec: TaskSpec, device: str | None, path: Path | None, info: dict[str, Any], data: TaskData | None
) -> Run:
    from attnaudit.seed import resolve_device

    if device is None:  # placed by accelerate (--device-map): inputs go where the embeddings are
        dev = model.input_device
    else:
        dev = resolve_device(device)
        model.to(dev)
    model.eval()
    zero_shot = model.config.extra.get("zero_shot")
    chat = Chat.from_dict(model.config.extra["chat"]) if isinstance(model.config.extra.get("chat"), dict) else None
    if model.kind == "encoder-decoder":
        collate: Any = seq2seq_collator(model)
    elif zero_shot or chat is not None:  # a chat without a verbalizer: the text alone is the user's message
        prompt = zero_shot["prompt"] if zero_shot else "{text}"
        collate = ZeroShotCollator(prompt, model.tokenizer, spec.labels, model.config.max_len, chat=chat)
    else:
        collate = HFCollator(model.tokenizer, spec.labels, spec.task_type, model.config.max_len, model.uses_token_types)
    return Run(model=model, collate=collate, task=spec, path=path, device=dev, info=info, _data=data)


def _placement(device_map: str | dict[str, str | int] | None, max_memory: str | dict[str | int, str] | None) -> dict[str, Any]:
    """accelerate's loading arguments for ``--device-map``/``--max-memory``: offloaded layers go to a temporary
    folder removed when the process ends; empty without a device map."""
    if device_map is None:
        if max_memory is not None:
            raise AttnAuditError("--max-memory applies with --device-map")
        return {}
    import atexit
    import shutil
    import tempfile

    memory = parse_max_memory(max_memory) if isinstance(max_memory, str) else max_memory
    mapping = parse_device_map(device_map) if isinstance(device_map, str) else device_map
    check_devices(mapping, memory)
    folder = tempfile.mkdtemp(prefix="attnaudit-offload-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    placement: dict[str, Any] = {"device_map": mapping, "offload_folder": folder}
    if memory:
        placement["max_memory"] = memory
    return placement


def load_hf(
    name_or_path: str | Path,
    task: str | TaskData | None = None,
    data_dir: str | Path | None = None,
    device: str | None = "auto",
    num_labels: int | None = None,
    prompt: str | None = None,
    verbalizer: str | dict[str, str] | None = None,
    dtype: torch.dtype | str = torch.float32,
    max_length: int | None = None,
    device_map: str | dict[str, str | int] | None = None,
    max_memory: str | dict[str | int, str] | None = None,
    chat: bool | None = None,
    system: str | None = None,
    items: str | None = None,
) -> Run:
    """A :class:`~attnaudit.run.Run` around a Hugging Face encoder or decoder.

    ``name_or_path``: ``minilm`` (the embedded all-MiniLM-L6-v2), a local directory or a hub
    name. ``task`` (a task string or TaskData) supplies labels and data; without a trained
    classification head, tests that need predictions do not apply (``run.model.trained_head``).
    ``num_labels`` adds a fresh head to a headless checkpoint (what fine-tuning starts from).
    A causal LM without a head classifies zero-shot with ``prompt`` (containing ``{text}``) and
    ``verbalizer`` (label -> word, or ``'positive=" positive",negative=" negative"'``), or the
    named task's defaults (:mod:`attnaudit.models.hf.zeroshot`); then it has a prediction.
    ``dtype``: a decoder's parameter dtype (:data:`attnaudit.models.hf.loading.DTYPES`, or its
    name as ``--dtype`` gives it). ``max_length`` (``--max-length``): keep at most that many
    tokens of each text (the collator's ``max_text``; special tokens and a prompt's template stay).
    An encoder-decoder (Marian, BART, T5; e.g. ``Helsinki-NLP/opus-mt-de-en``) runs on seq2seq
    tasks (``europarl-deen``): teacher-forced, its trace holds encoder, decoder and cross-attention.
    ``device_map`` (``--device-map``: ``auto``, another accelerate strategy or module -> device) spreads a model
    larger than one device over the GPUs, the CPU and disk (``max_memory``: ``cpu=2GiB,0=20GiB``, the budget per
    device); then ``device`` is not used, each layer runs where accelerate put it.
    ``chat`` (``--chat``, a decoder whose tokenizer has a chat template): each prompt is the user's message rendered
    by that template after the ``system`` message (:mod:`attnaudit.models.hf.chat`); ``items``: ``user`` (the
    user's text, default) or ``all`` positions are the explained items.
    """
    check_max_length(max_length)
    chatting = check_chat_options(chat, system, items)
    placement = _placement(device_map, max_memory)
    if isinstance(dtype, str):
        dtype = DTYPES[check_dtype(dtype)]
    source = resolve_source(name_or_path)
    data: TaskData | None
    if task is None:
        data = None
        spec = TaskSpec(spec="", task_type="classification", labels=[], data_dir=absolute_dir(data_dir))
    else:
        if isinstance(task, TaskData):
            data = task
        else:
            from attnaudit.data.tasks import load_task

            data = load_task(task, data_dir=data_dir)
        spec = TaskSpec(
            spec=task if isinstance(task, str) else data.name,
            task_type=data.task_type,
            labels=list(data.labels),
            data_dir=absolute_dir(data_dir),
        )
    model = build_hf_model(source, spec.task_type, num_labels, dtype=dtype, placement=placement)
    _check_task(model, spec, task is None, source)
    if chatting is not None:
        if model.kind != "decoder" or model.config.extra.get("output") != "next_token":
            raise AttnAuditError(f"--chat applies to a decoder-only causal language model without a classification head; {source} is not one")
        check_chat_template(model.tokenizer, source)
        model.config.extra["chat"] = chatting.to_dict()
    if model.kind == "decoder" and num_labels is None:
        chosen = resolve_zero_shot(spec.spec if isinstance(task, str) else None, prompt, verbalizer, chat=chatting is not None)
        derived = chosen is None and len(spec.labels) >= 2 and spec.task_type == "classification"
        if derived and model.config.extra.get("output") == "next_token":  # any labelled data: ask by the label names
            chosen = derive_zero_shot(spec.labels, model.tokenizer, chat=chatting is not None)
        if chosen is not None and model.config.extra.get("output") == "next_token":
            spec.labels = spec.labels or list(chosen[1])
            make_zero_shot(model, chosen[0], chosen[1], spec.labels, derived=derived)
        elif prompt is not None or verbalizer is not None:
            raise AttnAuditError(f"--prompt/--verbalizer need a causal language model without a classification head; {source} is not one")
    elif prompt is not None or verbalizer is not None:
        raise AttnAuditError(f"--prompt/--verbalizer need a decoder-only causal language model; {source} is not one")
    if model.has_head and spec.labels and model.config.num_labels != len(spec.labels):
        raise AttnAuditError(
            f"{source} predicts {model.config.num_labels} labels but task {spec.spec!r} has {len(spec.labels)}"
        )
    info: dict[str, Any] = {"kind": "hf", "source": source, "trained_head": model.trained_head}
    if dtype != torch.float32:  # recorded only when not the default, so stored results keep their fingerprints
        info["dtype"] = str(dtype).removeprefix("torch.")
    if max_length is not None:
        info["max_length"] = max_length
    if chatting is not None:
        info["chat"] = chatting.to_dict()
    if placement:
        info["device_map"] = getattr(model.hf, "hf_device_map", None) or placement["device_map"]
    run = _make_run(model, spec, None if placement else device, None, info, data)
    run.collate.max_text = max_length  # type: ignore[attr-defined]
    return run


def _check_task(model: HFModel, spec: TaskSpec, no_task: bool, source: str) -> None:
    """Refuse a task the model cannot do: an encoder-decoder translates (seq2seq tasks), the others
    classify (classification and pair tasks). Without a task, an encoder-decoder's spec says seq2seq."""
    if model.kind == "encoder-decoder":
        if no_task:
            spec.task_type = "seq2seq"
        elif spec.task_type != "seq2seq":
            raise AttnAuditError(f"{source} is an encoder-decoder: it runs on seq2seq tasks (e.g. europarl-deen), not {spec.task_type}")
    elif spec.task_type not in ("classification", "pair"):
        raise AttnAuditError(f"Hugging Face encoders and decoders here handle classification and pair tasks, not {spec.task_type}")


def save_hf_run(run: Run, out: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write ``out/config.json`` (``kind: hf``) and ``out/hf/`` (``save_pretrained``, safetensors + tokenizer).

    The model directory is written next to its final place and swapped in, so an
    interrupted save never leaves a half-written model under ``out/hf``.
    """
    from attnaudit import __version__
    from attnaudit.io import file_mode

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = run.model
    if not isinstance(model, HFModel):
        raise AttnAuditError(f"save_hf_run saves Hugging Face runs, not {run.family}")
    tmp = out / f".{HF_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with quiet_transformers():
        model.hf.config.id2label = dict(enumerate(run.labels)) if run.labels else model.hf.config.id2label
        model.hf.config.label2id = {v: k for k, v in model.hf.config.id2label.items()}
        model.hf.save_pretrained(tmp, safe_serialization=True)
        model.tokenizer.save_pretrained(tmp)
    for file in tmp.rglob("*"):
        if file.is_file():
            file.chmod(file_mode())  # safetensors writes model.safetensors 0600, whatever the umask
    final = out / HF_DIR
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    config = {
        "kind": "hf",
        "version": __version__,
        "model": model.config.to_dict(),
        "task": run.task.to_dict(),
        "hf": {"dir": HF_DIR, "source": model.config.extra.get("source"), "type": model.hf_type},
        **(extra or {}),
    }
    write_config(out, config)
    return out


def load_hf_run(path: str | Path, device: str | None = "auto", data_dir: str | Path | None = None) -> Run:
    """Load a run directory written by :func:`save_hf_run` (kind ``hf``; safetensors + JSON only)."""
    path = Path(path)
    raw = read_config(path)
    try:
        spec = TaskSpec(**raw["task"])
        trained = bool(raw["model"].get("extra", {}).get("trained_head", True))
    except (TypeError, AttributeError) as exc:
        raise InputError(path / "config.json", f"malformed Hugging Face run config: {exc}") from None
    given = str(raw.get("hf", {}).get("dir", HF_DIR))
    model_dir = path / given
    if not model_dir.resolve().is_relative_to(path.resolve()):  # a run reads nothing outside its own folder
        raise InputError(path / "config.json", f"hf.dir {given!r} leads outside the run folder; it names a folder inside it ({HF_DIR!r})")
    if not (model_dir / "config.json").exists():
        raise InputError(model_dir, "Hugging Face model directory missing from the run")
    model = build_hf_model(str(model_dir), spec.task_type, trained_head=trained)
    zero_shot = raw["model"].get("extra", {}).get("zero_shot")
    if model.kind == "decoder" and isinstance(zero_shot, dict):
        make_zero_shot(model, str(zero_shot.get("prompt", "")), dict(zero_shot.get("verbalizer", {})), spec.labels)
    chat = raw["model"].get("extra", {}).get("chat")
    if model.kind == "decoder" and isinstance(chat, dict):  # a saved run keeps its chat rendering
        check_chat_template(model.tokenizer, str(model_dir))
        model.config.extra["chat"] = Chat.from_dict(chat).to_dict()
    if data_dir is not None:
        spec.data_dir = absolute_dir(data_dir)
    info = {**raw, "source": str(model_dir), "trained_head": trained}
    return _make_run(model, spec, device, path, info, None)

