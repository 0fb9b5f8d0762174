"""Functions for `LLM.collective_rpc`: they run on vLLM's worker processes (so they are
module-level and importable there) and report what the connector and the vision tower did."""

from __future__ import annotations

from typing import Any


def _runner(worker: Any) -> Any:
    worker = getattr(worker, "worker", worker)  # a WorkerWrapperBase holds the worker
    return worker.model_runner


def connector_counters(worker: Any) -> dict[str, Any]:
    """The connector's counters: this worker's (saves, outputs placed) and the scheduler's
    (hits, misses, damaged, ...) as its last step's metadata carried them."""
    from vllm.distributed.ec_transfer import get_ec_transfer, has_ec_transfer

    if not has_ec_transfer():
        return {}
    connector = get_ec_transfer()
    return {"worker": {**connector.cache.metrics.as_dict(), "placed": connector.placed},
            "scheduler": dict(connector.scheduler_metrics)}


def count_vision_calls(worker: Any) -> int:
    """Calls to the model's vision tower (`visual`) since the first call of this function,
    which installs the counter."""
    model = _runner(worker).get_model()
    visual = getattr(model, "visual", None)
    if visual is None:
        raise AttributeError(f"{type(model).__name__} has no `visual` module to count")
    if not hasattr(visual, "_vlcache_calls"):
        visual._vlcache_calls = 0

        def hook(module: Any, args: Any, output: Any) -> None:
            module._vlcache_calls += 1

        visual.register_forward_hook(hook)
    return visual._vlcache_calls
