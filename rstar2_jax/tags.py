"""The literal tags of the chat template (docs/design.md §3), in one frozen value.

``TemplateConfig.tags`` (``rstar2_jax.rollout.template``) owns the instance a run uses; the rollout,
the format statistics (``rewards.format``) and answer extraction (``rewards.extract``) read the tags
from there instead of spelling them out. This module is a leaf (no imports from the package), so
``rewards/`` can use it without importing ``rollout/``.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Tags:
    """Tag strings of the template: reasoning, answer, tool call / response and Qwen chat markers."""

    reason_open: str = "<reason>"
    reason_close: str = "</reason>"
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"
    tool_call_open: str = "<tool_call>"
    tool_call_close: str = "</tool_call>"
    tool_response_open: str = "<tool_response>"
    tool_response_close: str = "</tool_response>"
    im_start: str = "<|im_start|>"
    im_end: str = "<|im_end|>"
    end_of_text: str = "<|endoftext|>"  # Qwen's document end; a special token a grader's decode drops

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in values.items():
            if not isinstance(value, str) or not value or value != value.strip():
                raise ValueError(f"Tags.{name} must be a non-empty string without surrounding space, got {value!r}")
        if len(set(values.values())) != len(values):
            raise ValueError(f"Tags must be distinct, got {values}")

    @property
    def assistant_header(self) -> str:
        """``<|im_start|>assistant``: where an assistant turn begins."""
        return f"{self.im_start}assistant"

    @property
    def chat_markers(self) -> tuple[str, ...]:
        """The special chat tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``)."""
        return (self.im_start, self.im_end, self.end_of_text)


DEFAULT_TAGS = Tags()
