"""vlcache's stores as vLLM's encoder cache (EC connector). This package's core (keys, cache,
pins, metrics) does not import vLLM; `vlcache_vllm.connector` does."""

from vlcache_vllm.cache import EncoderCache, Expected, check_shared
from vlcache_vllm.keys import EncoderKey, model_fingerprint
from vlcache_vllm.metrics import CacheMetrics
from vlcache_vllm.pins import Pins

CONNECTOR = "VlcacheECConnector"
CONNECTOR_MODULE = "vlcache_vllm.connector"

__all__ = ["CONNECTOR", "CONNECTOR_MODULE", "CacheMetrics", "EncoderCache", "EncoderKey",
           "Expected", "Pins", "check_shared", "model_fingerprint"]
