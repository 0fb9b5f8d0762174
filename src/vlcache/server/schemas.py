"""The OpenAI chat-completions wire format, as pydantic models (the subset vlcache serves).

Unknown request fields are ignored, as OpenAI-compatible servers commonly do; fields that would
change the answer and are not supported (n > 1, logprobs) are refused.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

# --- request ----------------------------------------------------------------------------------


class ImageURL(BaseModel):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the processor decides


class ContentPart(BaseModel):
    """One part of a message: `{"type": "text", "text"}` or `{"type": "image_url", ...}`.

    vlcache extension: `{"type": "text", "text": ..., "cache": true}` marks a reusable text
    segment (a document), cached and reused wherever it appears, like an image.
    """

    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None
    cache: bool = False

    @model_validator(mode="after")
    def _has_its_field(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise ValueError("a 'text' part needs a 'text' field")
        if self.type == "image_url" and self.image_url is None:
            raise ValueError("an 'image_url' part needs an 'image_url' object with a 'url'")
        return self


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: list[ContentPart] | None = None  # a plain string arrives as one text part

    @field_validator("content", mode="before")
    @classmethod
    def _string_is_one_text_part(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [{"type": "text", "text": v}]
        if v is not None and not isinstance(v, list):
            raise ValueError("content must be a string or a list of content parts")
        return v


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # None: OpenAI's default, 1.0
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: list[str] | None = Field(None, max_length=4)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    n: int | None = None
    logprobs: bool | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_is_a_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("logprobs are not supported")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# --- response ---------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CacheUsage(BaseModel):
    """vlcache's own usage block: what the image cache did for this request."""

    policy: str
    images: int
    images_hit: int  # encoder output taken from the store: the vision tower was skipped
    images_missed: int  # the vision tower ran
    images_kv_reused: int
    image_tokens: int
    image_tokens_reused: int  # prompt_tokens_details.cached_tokens counts images and documents
    image_tokens_recomputed: float  # of the reused images' tokens, mean over layers
    documents: int = 0  # text parts marked "cache": true
    documents_reused: int = 0
    text_tokens_reused: int = 0
    ttft_s: float  # engine time to first token (queue wait not included)
    prepare_s: float = 0.0  # images decoded and keyed, text tokenized
    vision_s: float  # a miss's preprocessing and vision tower
    queue_s: float  # time spent waiting for the model worker


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    vlcache: CacheUsage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer
    def _set_fields_only(self) -> dict[str, str]:  # OpenAI sends {} in the last chunk
        return {k: v for k, v in (("role", self.role), ("content", self.content))
                if v is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vlcache"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
