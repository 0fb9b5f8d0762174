"""vLLM's CPU worker with vlcache's model runner (`worker_cls`; imports vLLM).

The model cannot tell which image a row of the flat batch belongs to: vLLM's forward gets
embeddings and positions, while the image's mm_hash lives in the runner's request state. The
runner therefore builds, each step, the `Step` the model needs: for every request that asked
for vlcache (`SamplingParams.extra_args={"vlcache": "static:0.05"}`, or "" for the default
policy; flat, so the OpenAI server's `vllm_xargs` can carry it too) and is still in prefill, its
images with the entry loaded (a hit: the policy's selections) or marked to save (a miss).
Entries are loaded when the request first appears and dropped when its prefill ends.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

from vlcache.reuse.registry import parse_policy
from vlcache_vllm.keys import model_fingerprint
from vlcache_vllm.reuse.config import ReuseConfig
from vlcache_vllm.reuse.entries import KVEntries, KVShape
from vlcache_vllm.reuse.model import VlcacheQwen2_5_VL
from vlcache_vllm.reuse.rows import StepImage, UnservedPolicy, selections_for
from vlcache_vllm.reuse.step import Step

log = logging.getLogger("vlcache_vllm")


@dataclass
class ImageState:
    start: int
    num_tokens: int
    mm_hash: str
    selections: list[torch.Tensor] | None = None  # a hit
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    saved: bool = False
    # a miss being captured, possibly over several steps (chunked prefill)
    capture: Capture | None = None


@dataclass
class Capture:
    keys: torch.Tensor  # [L, N, kvh, d] pre-RoPE
    values: torch.Tensor  # [L, N, kvh, d]
    positions: torch.Tensor  # [3, N]
    covered: torch.Tensor  # [N] bool: rows captured so far


@dataclass
class RequestState:
    prompt_len: int
    images: list[ImageState] = field(default_factory=list)


class VlcacheWorker(CPUWorker):
    """CPUWorker whose model runner serves vlcache entries (`worker_cls` points here)."""

    def init_device(self) -> None:
        if self.vllm_config.use_v2_model_runner:
            raise ValueError("vlcache's worker extends vLLM's V1 CPU model runner; "
                             "unset the V2 model runner")
        super().init_device()
        self.model_runner = VlcacheModelRunner(self.vllm_config, torch.device("cpu"))


class VlcacheModelRunner(CPUModelRunner):
    def __init__(self, vllm_config, device: torch.device) -> None:
        super().__init__(vllm_config, device)
        self.vlcache = ReuseConfig.from_additional(vllm_config.additional_config)
        self.vlcache_requests: dict[str, RequestState] = {}
        self.vlcache_entries: KVEntries | None = None
        self.vlcache_rows = {"reused_rows": 0}
        text = vllm_config.model_config.hf_config.get_text_config()
        self.vlcache_shape = KVShape(text.num_hidden_layers, text.num_key_value_heads,
                                     text.hidden_size // text.num_attention_heads,
                                     vllm_config.model_config.dtype)

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        if not isinstance(self.model, VlcacheQwen2_5_VL):
            raise ValueError(
                f"vlcache's worker needs its Qwen2.5-VL class, got {type(self.model).__name__}:"
                " install vlcache-vllm in vLLM's environment (its vllm.general_plugins entry "
                "point registers the class) and serve a Qwen2.5-VL checkpoint")
        if not self.vllm_config.model_config.enforce_eager:
            raise ValueError("vlcache's reuse runs in eager mode: set enforce_eager=True")
        model = self.vllm_config.model_config
        fingerprint = self.vlcache.model_fingerprint or model_fingerprint(
            model.model, "Qwen2_5_VLForConditionalGeneration", str(model.dtype))
        self.vlcache_entries = KVEntries.open(self.vlcache.store, fingerprint)

    def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None,
                       inputs_embeds=None, **model_kwargs):
        step = self.vlcache_step()
        if step is None:
            return super()._model_forward(input_ids, positions, intermediate_tensors,
                                          inputs_embeds, **model_kwargs)
        start = time.perf_counter()
        out = self.model(input_ids=input_ids, positions=positions,
                         intermediate_tensors=intermediate_tensors, inputs_embeds=inputs_embeds,
                         reuse=step, **model_kwargs)
        self.vlcache_after(step, positions)
        self.vlcache_rows["reused_rows"] += step.reused_rows
        log.debug("vlcache step: %d images (%d hits), %d rows reused, %.3f s",
                  len(step.images), sum(im.hit for im in step.images), step.reused_rows,
                  time.perf_counter() - start)
        return out

    # -- per-request state -------------------------------------------------------------------

    def vlcache_step(self) -> Step | None:
        for gone in set(self.vlcache_requests) - set(self.requests):
            del self.vlcache_requests[gone]
        images: list[StepImage] = []
        for i, req_id in enumerate(self.input_batch.req_ids):
            state = self.vlcache_requests.get(req_id)
            if state is None and req_id not in self.vlcache_requests:
                state = self.vlcache_requests[req_id] = self.vlcache_open(req_id)
            if state is None:
                continue
            for image in state.images:
                if image.selections is not None:
                    images.append(StepImage(i, image.start, image.num_tokens, image.mm_hash,
                                            image.selections, image.keys, image.values))
                elif not image.saved:
                    capture = image.capture = image.capture or self.vlcache_capture(image)
                    images.append(StepImage(i, image.start, image.num_tokens, image.mm_hash,
                                            save=True, captured_keys=capture.keys,
                                            captured_values=capture.values))
        if not images:
            return None
        return Step(images)

    def vlcache_capture(self, image: ImageState) -> Capture:
        shape = self.vlcache_shape
        size = (shape.layers, image.num_tokens, shape.kv_heads, shape.head_dim)
        return Capture(torch.zeros(size, dtype=shape.dtype), torch.zeros(size, dtype=shape.dtype),
                       torch.zeros(3, image.num_tokens, dtype=torch.int64),
                       torch.zeros(image.num_tokens, dtype=torch.bool))

    def vlcache_open(self, req_id: str) -> RequestState | None:
        """A request's vlcache state on first sight, or None if it did not ask for reuse."""
        request = self.requests[req_id]
        extra = (request.sampling_params.extra_args or {}) if request.sampling_params else {}
        if "vlcache" not in extra:
            return None
        asked = extra["vlcache"]  # a policy name, or "" for the configured default
        try:
            policy = parse_policy(asked if isinstance(asked, str) and asked
                                  else self.vlcache.policy)
        except ValueError as e:
            log.warning("vlcache: request %s: %s; it runs without reuse", req_id, e)
            return None
        state = RequestState(len(request.prompt_token_ids or []))
        for feature in request.mm_features:
            if feature.modality != "image":
                continue
            place = feature.mm_position
            if place.is_embed is not None and not bool(place.is_embed.all()):
                log.warning("vlcache: request %s: an image placeholder with non-image tokens "
                            "inside; not reused", req_id)
                continue
            n = place.length
            image = ImageState(place.offset, n, feature.identifier)
            entry = (self.vlcache_entries.load(feature.identifier, n, self.vlcache_shape)
                     if policy.reuse_kv else None)
            if entry is not None:
                try:
                    image.selections = selections_for(policy, n, self.vlcache_shape.layers)
                except UnservedPolicy as e:
                    log.warning("vlcache: %s; request %s computes its image", e, req_id)
                    image.saved = True
                    state.images.append(image)
                    continue
                image.keys, image.values = entry.keys, entry.values
            state.images.append(image)
        return state

    def vlcache_after(self, step: Step, positions: torch.Tensor) -> None:
        """Save complete captures; drop the entries of requests whose prefill is over."""
        req_ids = self.input_batch.req_ids
        for image in step.images:
            if not image.save:
                continue
            window = step.windows[image.request]
            state = self.vlcache_requests[req_ids[image.request]]
            mine = next(s for s in state.images if s.start == image.start)
            lo = max(image.start, window.first)
            hi = min(image.start + image.num_tokens, window.first + window.count)
            if hi <= lo:
                continue
            capture = mine.capture
            row = window.row + lo - window.first
            local = slice(lo - image.start, hi - image.start)
            capture.positions[:, local] = positions[:, row:row + hi - lo]
            capture.covered[local] = True
            if bool(capture.covered.all()):
                self.vlcache_entries.save(image.mm_hash, capture.keys, capture.values,
                                          capture.positions)
                mine.saved, mine.capture = True, None
        for i, window in enumerate(step.windows):
            state = self.vlcache_requests.get(req_ids[i])
            if state is not None and window.first + window.count >= state.prompt_len:
                for image in state.images:  # prefill done: free the entry and any capture
                    if image.capture is not None:  # rows before this request's first step
                        log.info("vlcache: image %s was not captured whole (prefix-cached "
                                 "rows); not saved", image.mm_hash)
                    image.selections = image.keys = image.values = image.capture = None
                    image.saved = True
