"""vLLM general plugin (entry point `vllm.general_plugins`): registers vlcache's Qwen2.5-VL
class in every vLLM process. Without vlcache's worker (`worker_cls`) it runs exactly as
vLLM's own class; the registration is lazy, so vLLM imports nothing of vlcache until the model
is built."""

from __future__ import annotations

ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
MODEL_CLASS = "vlcache_vllm.reuse.model:VlcacheQwen2_5_VL"


def register() -> None:
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
