"""Whether the chat model sees images, and asking a model that does about one image (the ``vision_analyze`` tool)."""

from __future__ import annotations

import re
from typing import Literal

import openai

from gateway.agent_loop import post_chat_completion
from gateway.media.errors import MediaError, endpoint_error

VISION_MODELS = re.compile(
    r"""
    (?:chat)?gpt-4o | gpt-4\.1 | gpt-4-turbo(?!-preview) | gpt-5        # OpenAI: the 4o, 4.1, 4 Turbo and 5 families
    | o1(?!\d|-mini|-preview) | o3(?!\d|-mini) | o4(?!\d)             #   reasoning models but o1-mini/-preview, o3-mini
    | claude-3 | claude-[a-z]+-4                                       # Anthropic: Claude 3 and the 4 generation
    | gemini                                                           # Google: Gemini; Gemma 3
    | gemma-?3
    | llava | bakllava | pixtral | moondream | minicpm-v | llama-?4    # open models that see
    | .*-vl(?=$|[-_:.\d])                                              # Qwen-VL, Qwen2.5-VL, InternVL-style "-vl"
    | .*vision                                                         # gpt-4-vision, llama-3.2-11b-vision, ...
    """,
    re.VERBOSE,
)
"""Model families known to take image content parts, matched at the start of the model's name (lower case, any
``vendor/`` prefix of OpenRouter-style names removed); ``-vl`` and ``vision`` anywhere in it."""


def model_sees_images(model_cfg_vision: Literal["auto"] | bool, model_name: str) -> bool:
    """``model.vision`` resolved for ``model_name``: true or false as set, ``"auto"`` by ``VISION_MODELS``."""
    if model_cfg_vision != "auto":
        return bool(model_cfg_vision)
    return VISION_MODELS.match(model_name.strip().lower().rsplit("/", 1)[-1]) is not None


async def describe_image(client: openai.AsyncOpenAI, model: str, image_data_url: str, question: str,
                         max_tokens: int) -> str:
    """``model``'s answer to ``question`` about the image (one chat completion, the image as an image part);
    ``MediaError`` when the call fails or the answer is empty."""
    content = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": image_data_url}}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    try:
        response = await post_chat_completion(client, body)
    except openai.OpenAIError as exc:
        raise endpoint_error(exc, "vision") from exc
    answer = response.choices[0].message.content if response.choices else None
    if not answer or not answer.strip():
        raise MediaError("the vision model gave no answer.")
    return answer.strip()
