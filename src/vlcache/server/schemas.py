"""The OpenAI wire format (chat completions, completions) as pydantic models: the subset vlcache
serves.

Unknown request fields are ignored, as OpenAI-compatible servers commonly do. Fields that would
change the answer and that the engine cannot honour (tools, response_format, penalties, top_k,
logprobs, n > 1, ...) are refused with a 400 naming the field (`unsupported_parameter`), unless
they hold their neutral value. Types are strict where a coercion would hide a client's bug:
`"max_tokens": true` or `"stream": "yes"` are refused, not read as 1 and true.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

UNSUPPORTED = "unsupported_parameter"
TOO_MANY_MESSAGES = "too_many_messages"
TOO_MANY_PARTS = "too_many_content_parts"
REFUSALS = (UNSUPPORTED, TOO_MANY_MESSAGES, TOO_MANY_PARTS)  # answered 400 with this code
# Counted on the parsed JSON before the messages are validated: validating is ~2 us a part on
# the event loop, and 32 MiB of JSON holds a million empty parts.
MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 4096  # in all the messages of a request

# parameter -> its neutral values: anything else asks for what the engine cannot do
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tools": (None, []), "tool_choice": (None, "none", "auto"), "functions": (None, []),
    "function_call": (None, "none", "auto"), "response_format": (None, {"type": "text"}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1), "top_k": (None, 0, -1), "min_p": (None, 0),
    "logit_bias": (None, {}), "top_logprobs": (None, 0), "min_tokens": (None, 0),
    "stop_token_ids": (None, []), "ignore_eos": (None, False), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "use_beam_search": (None, False),
    "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""), "logprobs": (None, False),
}

# --- request ----------------------------------------------------------------------------------


def _neutral(name: str, value: Any) -> bool:
    """Equal to one of the parameter's neutral values and of its kind (0.0 is 0, False is not)."""
    return any(value == n and _kind(value) == _kind(n) for n in NEUTRAL[name])


def _kind(value: Any) -> type:
    return float if isinstance(value, int | float) and not isinstance(value, bool) else type(value)


def unsupported(why: str = "") -> PydanticCustomError:
    return PydanticCustomError(UNSUPPORTED, "not supported by this server{why}", {"why": why})


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
    cache: StrictBool = False

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
    include_usage: StrictBool = False


Refused = Annotated[Any, Field(None)]  # a parameter accepted only with its neutral value


class GenerationRequest(BaseModel):
    """What chat completions and completions share: sampling, streaming, refused parameters."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | None = Field(None, ge=0.0, le=2.0)  # None: OpenAI's 1.0
    top_p: StrictFloat | None = Field(None, gt=0.0, le=1.0)
    stop: list[str] | None = Field(None, max_length=4)
    seed: StrictInt | None = Field(None, ge=-(2**63), lt=2**64)
    n: StrictInt | None = Field(None, ge=1)
    presence_penalty: Refused
    frequency_penalty: Refused
    repetition_penalty: Refused
    top_k: Refused
    min_p: Refused
    logit_bias: Refused
    min_tokens: Refused
    stop_token_ids: Refused
    ignore_eos: Refused
    use_beam_search: Refused
    response_format: Refused

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_is_a_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, v: list[str] | None) -> list[str] | None:
        if v and any(s == "" for s in v):  # vLLM refuses it too: it would match everywhere
            raise ValueError("cannot contain an empty string (it would match everywhere)")
        return v

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v is not None and v > 1:
            raise unsupported(" (only n=1)")
        return v

    @field_validator("*")
    @classmethod
    def _refuse(cls, v: Any, info: ValidationInfo) -> Any:
        if info.field_name in NEUTRAL and not _neutral(info.field_name, v):
            raise unsupported()
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: Refused
    top_logprobs: Refused
    tools: Refused
    tool_choice: Refused
    functions: Refused
    function_call: Refused
    audio: Refused
    modalities: Refused
    prediction: Refused

    @field_validator("messages", mode="before")
    @classmethod
    def _few_enough(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        if len(v) > MAX_MESSAGES:
            raise PydanticCustomError(TOO_MANY_MESSAGES, "{n} messages, over the limit of {max}",
                                      {"n": len(v), "max": MAX_MESSAGES})
        parts = sum(len(m["content"]) for m in v
                    if isinstance(m, dict) and isinstance(m.get("content"), list))
        if parts > MAX_CONTENT_PARTS:
            raise PydanticCustomError(TOO_MANY_PARTS, "{n} content parts, over the limit of "
                                      "{max}", {"n": parts, "max": MAX_CONTENT_PARTS})
        return v


class CompletionRequest(GenerationRequest):
    """POST /v1/completions: one prompt string, completed without a chat template."""

    prompt: str
    logprobs: Refused
    best_of: Refused
    echo: Refused
    suffix: Refused

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if len(v) == 1 and isinstance(v[0], str):
                return v[0]
            raise unsupported(" as a list (send one prompt string)")
        return v


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


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class Completion(BaseModel):
    """A /v1/completions answer, and (with `usage` None until the last) each streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vlcache"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
