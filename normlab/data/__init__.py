"""Data layer: corpora, byte tokenizer, whole-work splits and stateless batch sampling; the
synthetic k-hop induction heads task (`normlab.data.khop`)."""

from normlab.data.batches import (
    SEPARATOR,
    BatchSampler,
    Span,
    TextData,
    TokenArray,
    eval_batches,
    stacked_batch,
)
from normlab.data.corpus import (
    CORPUS_CREDIT,
    DEFAULT_CORPUS,
    DataError,
    Source,
    Work,
    load_works,
    shakespeare_works,
)
from normlab.data.khop import KhopData, KhopTask
from normlab.data.split import split_works
from normlab.data.tasks import RunData, load_run_data, load_text_data
from normlab.data.tokens import VOCAB_SIZE, decode, encode

__all__ = [
    "CORPUS_CREDIT",
    "DEFAULT_CORPUS",
    "SEPARATOR",
    "VOCAB_SIZE",
    "BatchSampler",
    "DataError",
    "KhopData",
    "KhopTask",
    "RunData",
    "Source",
    "Span",
    "TextData",
    "TokenArray",
    "Work",
    "decode",
    "encode",
    "eval_batches",
    "load_run_data",
    "load_text_data",
    "load_works",
    "shakespeare_works",
    "split_works",
    "stacked_batch",
]
