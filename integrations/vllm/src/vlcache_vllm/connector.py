"""`VlcacheECConnector`: vLLM's encoder-cache connector interface over `EncoderCache`.

vLLM 0.32 creates one instance per role. The scheduler's decides hits: `has_cache_item` loads
and checks the entry and pins the checked tensor (vlcache_vllm.pins); `build_connector_meta`
sends the pinned tensors the scheduler allocated to the worker in the step's metadata. The
worker's places them in vLLM's encoder cache (`start_load_caches`) and saves each output its
vision tower computes (`save_caches`). Nothing here raises into vLLM after start-up: an error
is a logged miss or a skipped save.

    --ec-transfer-config '{"ec_connector": "VlcacheECConnector",
                           "ec_connector_module_path": "vlcache_vllm.connector",
                           "ec_role": "ec_both",
                           "ec_connector_extra_config": {"store": "disk:///var/cache/vlcache-ec"}}'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
)
from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorStats
from vllm.logger import init_logger

from vlcache_vllm.cache import EncoderCache, Expected
from vlcache_vllm.keys import model_fingerprint
from vlcache_vllm.metrics import CacheMetrics
from vlcache_vllm.pins import Pins
from vlcache_vllm.settings import Settings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = init_logger("vllm.ec_connector.vlcache")
SAVE_FIELDS = frozenset({"saves", "bytes_saved", "save_seconds"})


@dataclass
class VlcacheECMetadata(ECConnectorMetadata):
    """Scheduler -> worker, once per step: the checked outputs to place, and the scheduler's
    counters (so the worker, which `collective_rpc` reaches, can report both roles)."""

    loads: dict[str, torch.Tensor] = field(default_factory=dict)  # mm_hash -> [N, W]
    scheduler_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class VlcacheECStats(ECConnectorStats):
    """The scheduler's counters since the last report, summed (vLLM's stats logger prints them
    as "EC Transfer metrics: ...")."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: ECConnectorStats) -> ECConnectorStats:
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.data.items()}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class VlcacheECConnector(ECConnectorBase):
    """Encoder outputs shared through a vlcache store (disk, Redis, tiers); see the module
    docstring for the configuration."""

    def __init__(self, vllm_config: VllmConfig, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        settings = Settings.from_extra(vllm_config.ec_transfer_config.ec_connector_extra_config)
        model_config = vllm_config.model_config
        self._dtype: torch.dtype = model_config.dtype
        model = settings.model_fingerprint or model_fingerprint(
            model_config.model, (model_config.architectures or ["?"])[0],
            str(self._dtype).removeprefix("torch."))
        self.cache = EncoderCache.open(settings.store, model)
        self._pins = Pins(self.cache)
        self._reported = CacheMetrics()
        self._device = vllm_config.device_config.device
        self.placed = 0  # worker: outputs put into vLLM's encoder cache from the store
        self.scheduler_metrics: dict[str, float] = {}  # worker: as the scheduler last sent them
        logger.info("vlcache EC connector (%s, %s): store %s, model %s", role.name,
                    vllm_config.ec_transfer_config.ec_role, self.cache.store.address, model)

    # -- scheduler side: never raises

    def has_cache_item(self, identifier: str) -> bool:
        if not self.is_consumer:  # only consumers load; a hit here would be a miss there
            return False
        try:
            return self._pins.check(identifier, self._expected())
        except Exception:
            logger.exception("vlcache EC connector: checking %s failed, a miss", identifier)
            return False

    def update_state_after_alloc(self, request: Request, index: int) -> None:
        if not self.is_consumer:
            return
        try:
            mm_hash = request.mm_features[index].identifier
            output = self._pins.pinned(mm_hash)
            if output is None:
                return  # allocated to be computed, not loaded
            rows = request.get_num_encoder_embeds(index)
            if output.shape[0] != rows:  # only a caller's UUID reused for another item
                logger.error("vlcache EC connector: entry for %s has %d rows, the prompt has "
                             "%d; not loaded", mm_hash, output.shape[0], rows)
                return
            self._pins.want(mm_hash)
        except Exception:
            logger.exception("vlcache EC connector: update_state_after_alloc failed")

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ECConnectorMetadata:
        meta = VlcacheECMetadata()
        try:
            meta.loads = self._pins.take()
            meta.scheduler_metrics = self.cache.metrics.as_dict()
        except Exception:
            logger.exception("vlcache EC connector: build_connector_meta failed")
        return meta

    def get_ec_connector_stats(self) -> ECConnectorStats | None:
        now = self.cache.metrics.snapshot()
        delta, self._reported = now.minus(self._reported), now
        # the scheduler only loads; saves happen on the workers and are not counted here
        data = {k: v for k, v in delta.as_dict().items() if k not in SAVE_FIELDS}
        stats = VlcacheECStats(data=data)
        return None if stats.is_empty() else stats

    @classmethod
    def build_ec_connector_stats(cls, data: dict[str, Any] | None = None) -> ECConnectorStats:
        return VlcacheECStats(data=dict(data or {}))

    def _expected(self) -> Expected:
        # measured by vLLM at start-up for producers (ec_both, ec_producer); empty otherwise
        widths = self._vllm_config.ec_transfer_config.mm_encoder_output_widths
        return Expected(self._dtype, frozenset(widths.values()))

    # -- worker side

    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, VlcacheECMetadata):
            return
        self.scheduler_metrics = meta.scheduler_metrics
        for mm_hash, output in meta.loads.items():
            if mm_hash not in encoder_cache:
                encoder_cache[mm_hash] = output.to(self._device)
                self.placed += 1

    def save_caches(
        self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs: Any
    ) -> None:
        if self.is_producer:
            self.cache.save(mm_hash, encoder_cache[mm_hash])

    def shutdown(self) -> None:
        self.cache.close()
