"""The Hugging Face adapter: one :class:`HFModel` serves every architecture transformers registers (encoders,
decoders, encoder-decoders, GGUF files), through transformers' registration points, never a forked modeling file.

One module per concern: ``structure`` (the dry run that finds the blocks), ``attention`` (capture and interventions
at the softmax), ``layouts`` and ``projections`` (what a block computes), ``passes``, ``inputs``, ``restarts``,
``readout`` and ``generation`` (how a forward runs), ``capabilities``, ``config``, ``model`` (the adapter),
``loading`` and ``gguf`` (a name, folder or ``.gguf`` file to a model), ``fresh`` (built from scratch), ``batches``
(texts to batches), ``zeroshot`` (a causal LM classifying with a prompt) and ``chat`` (a prompt rendered by the
tokenizer's own chat template, with each position's role). The rest of attnaudit imports only the
names below; the modules are the package's own.
"""

from attnaudit.models.hf.batches import HFCollator, HFSubwords, forced_batch
from attnaudit.models.hf.batches import collator as seq2seq_collator
from attnaudit.models.hf.chat import ASSISTANT as ASSISTANT_ROLE
from attnaudit.models.hf.chat import ITEMS as CHAT_ITEMS
from attnaudit.models.hf.chat import ROLES, Chat, Rendered, check_chat_options, role_names
from attnaudit.models.hf.chat import check_template as check_chat_template
from attnaudit.models.hf.chat import render as render_chat
from attnaudit.models.hf.fresh import ARCHITECTURES as FRESH_ARCHITECTURES
from attnaudit.models.hf.fresh import fresh_seq2seq, fresh_tokenizer
from attnaudit.models.hf.gguf import cache_folder as gguf_cache_folder
from attnaudit.models.hf.layouts import BlockLayout
from attnaudit.models.hf.loading import DTYPES, HF_DIR, build_hf_model
from attnaudit.models.hf.loading import _quiet_transformers as quiet_transformers
from attnaudit.models.hf.model import HFModel
from attnaudit.models.hf.passes import HFLayer
from attnaudit.models.hf.zeroshot import ZeroShotCollator, make_zero_shot, parse_verbalizer, text_items
from attnaudit.models.hf.zeroshot import derive as derive_zero_shot
from attnaudit.models.hf.zeroshot import resolve as resolve_zero_shot

__all__ = [
    "ASSISTANT_ROLE", "CHAT_ITEMS", "DTYPES", "FRESH_ARCHITECTURES", "HF_DIR", "ROLES", "BlockLayout", "Chat", "HFCollator",
    "HFLayer", "HFModel", "HFSubwords", "Rendered", "ZeroShotCollator", "build_hf_model", "check_chat_options", "check_chat_template",
    "derive_zero_shot", "forced_batch", "fresh_seq2seq", "fresh_tokenizer", "gguf_cache_folder", "make_zero_shot", "parse_verbalizer",
    "quiet_transformers", "render_chat", "resolve_zero_shot", "role_names", "seq2seq_collator", "text_items",
]
