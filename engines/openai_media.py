"""A chat request's images as the OpenAI chat API takes them: ``image_url`` content parts.

The images go with the last user turn, before its text (as vLLM's and OpenAI's examples
put them), each inline as a data URL of the bytes the user gave (no re-encoding, so the
server decodes what a client would send). A request without images keeps plain string
contents, byte for byte what was sent before images existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.engine import Message
from harness.engine.media import ImageInput


def chat_messages(
    messages: Sequence[Message], images: Sequence[ImageInput]
) -> list[dict[str, Any]]:
    """The ``messages`` field of a chat request: ``images`` as parts of the last user turn."""
    out: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in messages]
    if not images:
        return out
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": image.data_url()}} for image in images
    ]
    if not users:  # a conversation of system turns: the images are the user's turn
        return [*out, {"role": "user", "content": parts}]
    last = users[-1]
    if messages[last].content:
        parts.append({"type": "text", "text": messages[last].content})
    out[last] = {"role": "user", "content": parts}
    return out
