"""The KV pool: pages and leases, quantized storage, recurrent-state slots, the prefix tree."""
from .cache import KvStorage, LayerKv, PagedKvCache, PageTables, kv_page_layout
from .memory import SequenceMemory
from .pages import ElasticPagePool, PageAllocator, PagePool, pages_for
from ..codecs.kv import KV_DTYPES, KvCodec, codecs_for
from .radix import PrefixTree
from .radix_nodes import Match
from .slots import StatePool

__all__ = ["KV_DTYPES", "ElasticPagePool", "KvCodec", "KvStorage", "LayerKv", "Match",
           "PageAllocator", "PagePool", "PageTables", "PagedKvCache", "PrefixTree",
           "SequenceMemory", "StatePool", "codecs_for", "kv_page_layout", "pages_for"]
