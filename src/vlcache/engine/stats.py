"""Per-request statistics: what was reused, what was computed, where the time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RequestStats:
    policy: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    images: int = 0  # image occurrences in the prompt (an image sent twice counts twice)
    images_hit: int = 0  # distinct images whose encoder output came from the store
    images_kv_reused: int = 0  # occurrences whose KV entry was reused at the new position
    segments_exact: int = 0  # reused behind an identical prefix: exact, nothing recomputed
    prefix_tokens_reused: int = 0  # leading tokens served by the block prefix cache (exact)
    images_missed: int = 0  # distinct images the vision tower encoded
    image_tokens: int = 0
    image_tokens_reused: float = 0.0  # KV-reused image tokens, averaged over layers
    image_tokens_recomputed: float = 0.0  # of the reused images' tokens, computed (layer mean)
    documents: int = 0  # reusable text segments in the prompt
    documents_reused: int = 0  # whose KV was reused
    text_tokens_reused: float = 0.0  # their tokens not computed, averaged over layers
    computed_per_layer: list[int] = field(default_factory=list)  # |C_l|
    prepare_s: float = 0.0  # messages to prompt: images decoded and keyed, text tokenized
    vision_s: float = 0.0  # a miss's preprocessing and vision tower
    load_s: float = 0.0  # reading entries from the store
    prefill_s: float = 0.0
    select_s: float = 0.0  # part of prefill_s spent choosing tokens (the relevance pass)
    escalated: bool = False  # the guard recomputed every reused token (after its base pass)
    store_s: float = 0.0  # writing new entries
    ttft_s: float = 0.0
    decode_s: float = 0.0

    @property
    def cached_tokens(self) -> int:
        """Reused tokens (images and documents), as OpenAI's prompt_tokens_details."""
        return int(round(self.image_tokens_reused + self.text_tokens_reused
                         + self.prefix_tokens_reused))

    def to_dict(self) -> dict:
        return {**asdict(self), "cached_tokens": self.cached_tokens}
