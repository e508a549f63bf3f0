"""The KV pool: pages and leases, quantized storage, recurrent-state slots, prefix checkpoints."""
from .cache import KvStorage, LayerKv, PagedKvCache, PageTables, kv_page_layout
from .memory import SequenceMemory
from .pages import ElasticPagePool, PageAllocator, PagePool, pages_for
from .quant import KV_DTYPES, KvCodec, codecs_for
from .slots import Checkpoint, PrefixCache, PrefixIndex, StatePool

__all__ = ["KV_DTYPES", "Checkpoint", "ElasticPagePool", "KvCodec", "KvStorage", "LayerKv",
           "PageAllocator", "PagePool", "PageTables", "PagedKvCache", "PrefixCache",
           "PrefixIndex", "SequenceMemory", "StatePool", "codecs_for", "kv_page_layout",
           "pages_for"]
