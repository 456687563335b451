"""Loading Hugging Face models: any architecture from a folder, a hub name or a GGUF file, as :class:`HFModel`.

One loader for every family: the checkpoint's config says which transformers class to load
(with its classification head where it was saved with one, a fresh head for fine-tuning, else
the language-model head or the bare model); the adapter finds the rest by itself
(:mod:`attnaudit.models.hf.model`). Weights are safetensors only (never a pickle); a GGUF file is
de-quantised once into a safetensors cache (:mod:`attnaudit.models.hf.gguf`). Every failure is
one line: offline hub, missing files, a folder that is no model, a config transformers does not know.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnaudit.errors import AttnAuditError, InputError
from attnaudit.models.hf import gguf as gguf_cache
from attnaudit.models.hf.config import model_kind
from attnaudit.models.hf.model import HFModel
from attnaudit.weights import check_safetensors, checked_weight

if TYPE_CHECKING:
    from transformers import PreTrainedModel

HF_DIR = "hf"
"""Sub-directory of a run directory holding ``save_pretrained`` output (its own config.json)."""
GGUF_INSTALL = "pip install gguf==0.19.0 accelerate==1.15.0"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Parameter dtypes a model can be loaded in (``--dtype``); float32 is the default and the reference."""
HUB_EXAMPLE = "Helsinki-NLP/opus-mt-de-en"
TOKENIZER_FILES = (
    "tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "tokenizer.model", "sentencepiece.bpe.model", "source.spm",
    "merges.txt", "sentencepiece.model", "vocab.model", "spm.model",
)
"""The files a saved tokenizer consists of (by family); a model folder with none of them has no tokenizer."""


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports and progress bars (we print our own status)."""
    import logging

    from transformers.utils import logging as hf_logging

    hub = logging.getLogger("huggingface_hub")  # its download retries log one warning each
    level, bars, hub_level = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), hub.level
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        hub.setLevel(hub_level)
        if bars:
            hf_logging.enable_progress_bar()


def _hub_reachable() -> bool:
    """Whether the Hugging Face endpoint's host resolves; offline, a hub load would only retry for ~30 s."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:  # HF_HUB_OFFLINE=1: the user says the hub is not to be reached
        return False
    host = urlparse(constants.ENDPOINT).hostname
    try:
        socket.getaddrinfo(host or "huggingface.co", 443)
    except OSError:
        return False
    return True


def _pretrained(loader: Any, source: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` with one-line errors (offline hub, missing files, pickles only).

    A hub name is looked up in the local cache first; only when it is missing there and the
    hub's host resolves is it downloaded."""
    try:
        with _quiet_transformers():
            if Path(source).is_dir():
                return loader.from_pretrained(source, **kwargs)
            try:
                return loader.from_pretrained(source, local_files_only=True, **kwargs)
            except OSError:
                if not _hub_reachable():
                    raise AttnAuditError(
                        f"could not load Hugging Face model {source!r}: not in the local cache, and the hub "
                        "cannot be reached (offline?); give a local model folder (a translation model: one from "
                        "attnaudit train-nmt --arch marian), --hf minilm or --hf smollm2"
                    ) from None
            return loader.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        message = str(exc).strip().splitlines()
        raise AttnAuditError(f"could not load Hugging Face model {source!r}: {message[0] if message else type(exc).__name__}") from None


def _architectures(source: str) -> tuple[Any, bool]:
    """The checkpoint's config and whether it was saved with a sequence-classification head."""
    from transformers import AutoConfig

    if Path(source).is_dir() and not (Path(source) / "config.json").is_file():
        raise InputError(source, "holds no config.json: not a Hugging Face model folder (one written by save_pretrained)")
    config = _pretrained(AutoConfig, source)
    head = any(str(a).endswith("ForSequenceClassification") for a in (config.architectures or []))
    return config, head


def _weights_folder(source: str) -> Path | None:
    """The local folder holding ``source``'s safetensors files (a hub name: its cached snapshot)."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except (OSError, ValueError):
        return None


def _check_weights(source: str, hf: PreTrainedModel) -> None:
    """Refuse checkpoint tensors that the load cast silently: int/bool values for a floating
    parameter, or NaN/Inf (:func:`~attnaudit.weights.checked_weight`).

    A file key is matched to the model's key with or without the model prefix (``bert.``)."""
    from safetensors import safe_open

    folder = _weights_folder(source)
    dtypes: dict[str, torch.dtype] = {}
    for key, value in hf.state_dict().items():
        parts = key.split(".")
        for start in range(len(parts)):
            dtypes.setdefault(".".join(parts[start:]), value.dtype)
    for file in sorted(folder.glob("*.safetensors")) if folder else []:
        with safe_open(str(file), framework="pt") as fh:
            for key in fh.keys():
                dtype = dtypes.get(key) or dtypes.get(key.split(".", 1)[-1])
                if dtype is not None:
                    checked_weight(file, key, fh.get_tensor(key), dtype)


def _gguf(source: str) -> tuple[str, dict[str, str]]:
    """``(folder, extra from_pretrained kwargs)``: a ``.gguf`` file is loaded from its folder by name."""
    path = Path(source)
    if path.suffix.lower() == ".gguf":
        return str(path.parent), {"gguf_file": path.name}
    return source, {}


@contextlib.contextmanager
def _quiet_gguf() -> Iterator[None]:
    """Hide transformers' GGUF de-quantisation progress bar (a bare tqdm that its logging settings do not reach)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _load(loader: Any, folder: str, gguf: dict[str, str], **kwargs: Any) -> Any:
    """``loader.from_pretrained``: a folder or hub name through :func:`attnaudit.hf._pretrained`;
    a GGUF file directly (:func:`_load_gguf`; in practice once per file, see
    :mod:`attnaudit.models.hf.gguf`)."""
    if not gguf:
        return _pretrained(loader, folder, **kwargs)
    return _load_gguf(loader, folder, Path(folder) / gguf["gguf_file"], gguf, **kwargs)


def _load_gguf(loader: Any, folder: str, path: Path, gguf: dict[str, str], **kwargs: Any) -> Any:
    """``loader.from_pretrained`` of a GGUF file; a missing package or bad file is one error."""
    try:
        with _quiet_transformers(), _quiet_gguf():
            return loader.from_pretrained(folder, **gguf, **kwargs)
    except ImportError as exc:  # gguf or accelerate missing
        raise AttnAuditError(f"could not load {path}: {str(exc).strip().splitlines()[0]} ({GGUF_INSTALL})") from None
    except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError, struct.error) as exc:  # not a (supported) GGUF file
        message = str(exc).strip().splitlines()
        raise InputError(path, f"cannot be loaded as a GGUF model: {message[0] if message else type(exc).__name__}") from None


def _detach_gguf_quantizer(hf: PreTrainedModel) -> None:
    """Forget that a model came from GGUF. Its weights are already de-quantised to float32, but
    transformers keeps the GGUF quantizer attached, and that refuses ``save_pretrained``; without
    it a fine-tuned model saves as plain safetensors (and reloads as an ordinary checkpoint)."""
    hf.hf_quantizer = None  # type: ignore[assignment]  # set by from_pretrained, not declared by transformers
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config


def _convert_gguf(folder: str, gguf: dict[str, str], out: Path) -> None:
    """De-quantise a GGUF causal LM and its tokenizer into ``out`` as a float32 safetensors folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = _load(AutoModelForCausalLM, folder, gguf, attn_implementation="eager", dtype=torch.float32)
    _detach_gguf_quantizer(hf)
    tokenizer = _load(AutoTokenizer, folder, gguf)
    with _quiet_transformers():
        hf.save_pretrained(out)
        tokenizer.save_pretrained(out)



def _tokenizer(folder: str, gguf: dict[str, str]) -> Any:
    """The tokenizer saved with the model. A folder whose ``tokenizer_config.json`` names the generic
    fast tokenizer gets exactly that (transformers would otherwise rebuild some families' own class)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not gguf and Path(folder).is_dir() and not any((Path(folder) / name).exists() for name in TOKENIZER_FILES):
        raise InputError(
            folder, f"holds no tokenizer ({', '.join(TOKENIZER_FILES[:4])}, ...): save the tokenizer beside the model "
            "(tokenizer.save_pretrained(folder)); transformers would build an empty one"
        )
    settings = Path(folder) / "tokenizer_config.json"
    if not gguf and settings.is_file():
        with contextlib.suppress(OSError, ValueError):
            if json.loads(settings.read_text(encoding="utf-8")).get("tokenizer_class") == "PreTrainedTokenizerFast":
                return _pretrained(PreTrainedTokenizerFast, folder)
    try:
        return _load(AutoTokenizer, folder, gguf)
    except ImportError as exc:  # SentencePiece tokenizers (Marian, T5) need the sentencepiece package
        raise AttnAuditError(f"could not load the tokenizer of {folder}: {str(exc).strip().splitlines()[0]} (pip install sentencepiece)") from None


def _loader(kind: str, has_head: bool, num_labels: int | None, source: str) -> Any:
    """The transformers auto class to load: a saved or fresh classification head, else the LM head (the bare
    model for encoders)."""
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSeq2SeqLM,
        AutoModelForSequenceClassification,
    )

    if kind == "encoder-decoder":
        if num_labels is not None:
            raise AttnAuditError(
                f"{source} is an encoder-decoder (translation), which takes no classification head; "
                "train a translation model with attnaudit train-nmt --arch marian"
            )
        return AutoModelForSeq2SeqLM
    if has_head or num_labels is not None:
        return AutoModelForSequenceClassification
    return AutoModelForCausalLM if kind == "decoder" else AutoModel


def _check_module_names(loader: Any, config: Any, device_map: dict[str, Any], source: str) -> None:
    """Every module a device map names is one of the model's (built without weights from its config: nothing is
    loaded); a map naming a module that does not exist would otherwise be ignored or fail inside accelerate."""
    from accelerate import init_empty_weights

    with init_empty_weights(), _quiet_transformers():
        names = {name for name, _ in loader.from_config(config).named_modules()}
    unknown_names = [name for name in device_map if name and name not in names]
    if unknown_names:
        tops = sorted({name.split(".")[0] for name in names if name})
        raise AttnAuditError(f"--device-map names module {unknown_names[0]!r}, which {source} does not have; "
                             f"its top-level modules: {', '.join(tops)} ('' is the whole model)")


def build_hf_model(
    source: str,
    task_type: str,
    num_labels: int | None = None,
    trained_head: bool | None = None,
    dtype: torch.dtype = torch.float32,
    placement: dict[str, Any] | None = None,
) -> HFModel:
    """Load ``source`` (a folder or hub name: safetensors only; or a ``.gguf`` file) in eager mode and wrap it.

    A checkpoint saved with a sequence-classification head is loaded with it; otherwise ``num_labels``
    adds a fresh head (for fine-tuning) and None loads the causal LM (decoders), the LM head
    (encoder-decoders) or the bare model (encoders). ``dtype``: the parameters' dtype (float32, the
    reference; bfloat16 halves memory, e.g. on a GPU). ``placement``: accelerate's ``device_map``, ``max_memory`` and
    ``offload_folder``, for a model larger than one device (its layers spread over devices, the CPU and disk)."""
    folder, gguf = _gguf(source)
    cached = gguf_cache.converted(Path(folder) / gguf["gguf_file"], partial(_convert_gguf, folder, gguf)) if gguf else None
    if cached is not None:
        folder, gguf = str(cached), {}
    if gguf:
        config, has_head = _pretrained_config_gguf(folder, gguf), False
    else:
        config, has_head = _architectures(folder)
    kind = model_kind(config)
    loader = _loader(kind, has_head, num_labels, source)
    common: dict[str, Any] = {"attn_implementation": "eager", "dtype": dtype}
    if not gguf:
        common["use_safetensors"] = True
    if num_labels is not None and not has_head:
        common["num_labels"] = num_labels
    common.update(placement or {})
    if isinstance(common.get("device_map"), dict):
        _check_module_names(loader, config, common["device_map"], source)
    if not gguf:  # a cut or disguised weights file is one line here, not transformers' exception mid-load
        for file in sorted(weights_folder.glob("*.safetensors")) if (weights_folder := _weights_folder(folder)) else []:
            check_safetensors(file)
    hf = _load(loader, folder, gguf, **common)
    if gguf:
        _detach_gguf_quantizer(hf)
    if has_head and num_labels is not None and num_labels != hf.config.num_labels:
        raise AttnAuditError(f"{source} has a classification head with {hf.config.num_labels} labels, the task has {num_labels}")
    if not gguf and cached is None:  # the cache holds our own conversion
        _check_weights(folder, hf)
    tokenizer = _tokenizer(folder, gguf)
    model = wrap(hf, tokenizer, task_type, source, has_head or kind == "encoder-decoder" if trained_head is None else trained_head)
    if model.kind == "decoder" and model.has_head:
        hf.config.pad_token_id = tokenizer.pad_token_id  # the model's own sequence-classification pooling needs one
    return model


def _pretrained_config_gguf(folder: str, gguf: dict[str, str]) -> Any:
    from transformers import AutoConfig

    return _load(AutoConfig, folder, gguf)


def wrap(hf: PreTrainedModel, tokenizer: Any, task_type: str, source: str, trained_head: bool) -> HFModel:
    """:class:`HFModel` around a loaded model; a family the adapter cannot run is one line, never a traceback."""
    try:
        return HFModel(hf, tokenizer, task_type, source, trained_head)
    except AttnAuditError as exc:
        raise AttnAuditError(f"cannot audit {source} ({hf.config.model_type}): {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any failure of a family's own code in the dry run is reported in one line
        message = str(exc).strip().splitlines()
        raise AttnAuditError(
            f"cannot audit {source} ({hf.config.model_type}): its forward pass failed in the dry run "
            f"({type(exc).__name__}: {message[0] if message else ''}); please report the architecture"
        ) from None
