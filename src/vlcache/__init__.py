"""vlcache: position-independent image KV reuse for vision-language models."""

__version__ = "0.1.0"
