"""A prompt as a user's turn in a tokenizer's chat template: what a chat user sends (``--chat``, chat datasets)."""

from __future__ import annotations

from typing import Any

#: why a prompt cannot be sent as a chat turn, and what to do
NO_TEMPLATE = ("--chat wraps each prompt in the target's chat template, and its tokenizer has none (a base model's): "
               "drop --chat to send the prompts as written, or use an instruct model")


def user_turn(tok: Any, text: str) -> list[int]:
    """``text`` as the user's turn in ``tok``'s chat template, ready for the assistant's reply, in its token ids
    (refused for a tokenizer without a template)."""
    if not getattr(tok, "chat_template", None):
        raise ValueError(NO_TEMPLATE)
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False))
