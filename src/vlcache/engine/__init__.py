"""The serving engine and its request-level types."""

from vlcache.engine.engine import Engine, GenerationResult, StreamDelta
from vlcache.engine.limits import Limits, RequestError
from vlcache.engine.stats import RequestStats

__all__ = ["Engine", "GenerationResult", "Limits", "RequestError", "RequestStats", "StreamDelta"]
