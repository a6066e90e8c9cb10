"""Agentic rollout: the rStar2 template, the trajectory state machine, and the dispatcher."""

from rstar2_jax.rollout.template import (JUPYTER_TOOL_NAME, JUPYTER_TOOL_SCHEMA, PYTHON_TOOL_SCHEMA, RELEASE_TOOL_SCHEMA,
                                         TOOL_NAME, TemplateConfig, ToolCall, ToolCallError, find_tool_call,
                                         generation_prompt, parse_tool_call, render_prompt, render_tool_result,
                                         tool_format, tool_response_segment, tool_responses_segment, truncate_middle)
from rstar2_jax.rollout.tool_calls import FORMATS, ToolCallFormat
from rstar2_jax.rollout.trajectory import DONE_REASONS, Status, ToolRecord, Trajectory
from rstar2_jax.tags import Tags

__all__ = [
    "DONE_REASONS", "FORMATS", "JUPYTER_TOOL_NAME", "JUPYTER_TOOL_SCHEMA", "PYTHON_TOOL_SCHEMA", "RELEASE_TOOL_SCHEMA",
    "Status", "TOOL_NAME", "Tags", "TemplateConfig", "ToolCall", "ToolCallError", "ToolCallFormat", "ToolRecord",
    "Trajectory", "find_tool_call", "generation_prompt", "parse_tool_call", "render_prompt", "render_tool_result",
    "tool_format", "tool_response_segment", "tool_responses_segment", "truncate_middle",
]
