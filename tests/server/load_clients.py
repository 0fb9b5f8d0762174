"""The load test's clients, in a process of their own (sharing the server's GIL would slow the
server down 3x): `python -m tests.server.load_clients BASE_URL REQUESTS.json CLIENTS` runs the
[kind, body] pairs of the file and prints one JSON list of [kind, status, details]."""

from __future__ import annotations

import asyncio
import json
import sys

import openai


async def call(c: openai.AsyncOpenAI, body: dict) -> tuple[int, dict]:
    """(status, what this client saw): the error body, or the usage and any invalid fields."""
    try:
        if body["stream"]:
            chunks = [ch async for ch in await c.chat.completions.create(
                **body, stream_options={"include_usage": True})]
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
            usage, valid_shape = chunks[-1].usage, chunks[-1].choices == []
        else:
            answer = await c.chat.completions.create(**body)
            text, finish, usage = (answer.choices[0].message.content,
                                   answer.choices[0].finish_reason, answer.usage)
            valid_shape = answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    except openai.APIStatusError as e:
        return e.status_code, {**e.response.json()["error"],
                               "retry_after": e.response.headers.get("retry-after")}
    cache = usage.vlcache
    checks = {"shape": valid_shape, "text": isinstance(text, str),
              "finish": finish in ("stop", "length"),
              "length": usage.completion_tokens <= body["max_tokens"],
              "total": usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
              # reused image tokens and, with the block prefix cache, a repeated prompt's start
              "cached": usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens,
              "images": cache["images_hit"] + cache["images_missed"] == cache["images"]}
    return 200, {"invalid": [k for k, ok in checks.items() if not ok],
                 "cached": usage.prompt_tokens_details.cached_tokens,
                 "prompt": usage.prompt_tokens, "completion": usage.completion_tokens,
                 **{k: cache[k] for k in ("images_hit", "images_missed", "images_kv_reused")}}


async def run(base: str, requests: list[tuple[str, dict]],
              clients: int) -> list[tuple[str, int, dict]]:
    """`clients` clients work through `requests`; after a 503 a client waits Retry-After."""
    todo: asyncio.Queue = asyncio.Queue()
    for item in requests:
        todo.put_nowait(item)
    seen: list[tuple[str, int, dict]] = []

    async def one_client() -> None:
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0,
                                      timeout=60) as c:
            while not todo.empty():
                kind, body = todo.get_nowait()
                status, info = await call(c, body)
                seen.append((kind, status, info))
                if status == 503:
                    await asyncio.sleep(float(info["retry_after"]))

    await asyncio.gather(*(one_client() for _ in range(clients)))
    return seen


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        todo = json.load(f)
    print(json.dumps(asyncio.run(run(sys.argv[1], todo, int(sys.argv[3])))))
