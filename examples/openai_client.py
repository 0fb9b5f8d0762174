"""Smoke test for `vlcache serve`, with the official `openai` client.

    vlcache serve --model DIR &
    python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1] [--image FILE]

Asks about one image twice, in two contexts (different system prompt and question): the second
answer should report reused image tokens. Then streams a third answer.
"""

from __future__ import annotations

import argparse
import base64
import mimetypes
import sys
from pathlib import Path

import openai

HERE = Path(__file__).resolve().parent


def image_url(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def ask(url: str, system: str, question: str) -> list[dict]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": question}]}]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--image", type=Path, default=HERE / "shapes.png")
    p.add_argument("--max-tokens", type=int, default=16)
    args = p.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key="not-needed")
    model = client.models.list().data[0].id
    url = image_url(args.image)
    turns = [("You are a helpful assistant.",
              "What color is the shape on the left? Answer with one word."),
             ("You answer in one word.", "Is there a square in the picture? Answer with one word.")]
    for i, (system, question) in enumerate(turns, 1):
        answer = client.chat.completions.create(model=model, messages=ask(url, system, question),
                                                max_tokens=args.max_tokens, temperature=0)
        usage = answer.usage
        print(f"[{i}] Q: {question}\n    A: {answer.choices[0].message.content!r}")
        print(f"    cached_tokens={usage.prompt_tokens_details.cached_tokens} "
              f"prompt_tokens={usage.prompt_tokens} vlcache={usage.vlcache}")
    print("[3] streamed: ", end="")
    stream = client.chat.completions.create(model=model, stream=True, temperature=0,
                                            messages=ask(url, "Be brief.", "Describe it."),
                                            max_tokens=args.max_tokens,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n    cached_tokens={chunk.usage.prompt_tokens_details.cached_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
