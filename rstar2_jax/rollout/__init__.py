"""Agentic rollout: the rStar2 template, the trajectory state machine, and the dispatcher."""

from rstar2_jax.rollout.template import (PYTHON_TOOL_SCHEMA, RELEASE_TOOL_SCHEMA, TOOL_NAME, TemplateConfig, ToolCall,
                                         ToolCallError, find_tool_call, generation_prompt, parse_tool_call,
                                         render_prompt, render_tool_result, tool_response_segment, truncate_middle)
from rstar2_jax.rollout.trajectory import DONE_REASONS, Status, ToolRecord, Trajectory
from rstar2_jax.tags import Tags

__all__ = [
    "DONE_REASONS", "PYTHON_TOOL_SCHEMA", "RELEASE_TOOL_SCHEMA", "Status", "TOOL_NAME", "Tags", "TemplateConfig",
    "ToolCall", "ToolCallError", "ToolRecord", "Trajectory", "find_tool_call", "generation_prompt", "parse_tool_call",
    "render_prompt", "render_tool_result", "tool_response_segment", "truncate_middle",
]
