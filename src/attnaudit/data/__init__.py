"""Datasets: readers for the literature's formats, synthetic tasks, vocabularies, batching."""

from attnaudit.data.batching import Collator, iterate_batches
from attnaudit.data.readers import tokenize
from attnaudit.data.synthetic import make_classification, make_tagging, synthetic_task
from attnaudit.data.tasks import list_tasks, load_task, register_task
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.data.vocab import Vocab, load_vectors

__all__ = [
    "Batch",
    "Collator",
    "Example",
    "TaskData",
    "Vocab",
    "iterate_batches",
    "list_tasks",
    "load_task",
    "load_vectors",
    "make_classification",
    "make_tagging",
    "register_task",
    "synthetic_task",
    "tokenize",
]
