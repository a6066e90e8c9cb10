"""The tools a trajectory may call and their JSON schemas (docs/design.md §3).

Two tools, one per run (``TemplateConfig.tool``): ``"python"`` is the release's
``python_code_with_standard_io(code, input)``, a fresh process per call; ``"jupyter"`` is the release's
second tool, ``jupyter_code(code)``, whose cells share state across a trajectory's calls (a persistent
interpreter or the release's replay of earlier cells: ``RolloutConfig.tool_session``). The tools block
of the system prompt shows the schema (``tool_calls.ToolCallFormat.tools_block`` writes it per format).
"""

from __future__ import annotations

from typing import Any

TOOL_NAME = "python_code_with_standard_io"
JUPYTER_TOOL_NAME = "jupyter_code"
TOOLS = ("python", "jupyter")  # TemplateConfig.tool
TOOL_NAMES = {"python": TOOL_NAME, "jupyter": JUPYTER_TOOL_NAME}
# the arguments each tool takes, required first: a call must give "code"; "input" may be left out
TOOL_PARAMS: dict[str, tuple[str, ...]] = {"python": ("code", "input"), "jupyter": ("code",)}

PYTHON_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Execute Python code with standard input and capture standard output. "
                       "The last expression is printed. Use print() to output results.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python code to execute."},
                "input": {"type": "string", "description": "Text passed to the program's standard input."},
            },
            "required": ["code", "input"],
        },
    },
}

# The released tool schema (verl fork, recipe/rstar2_agent/config/tool_config/python_tool_config.yaml),
# key order as verl's pydantic model_dump gives it to the chat template.
RELEASE_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Execute Python code with standard input and capture standard output. This function takes a "
                       "Python code string and an input string, provides the input string through standard input "
                       "(stdin) to the code, and captures and returns any output produced through standard output "
                       "(stdout). If the executed code raises an exception, the error message will be captured and "
                       "returned instead.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "A string containing Python code to be executed. The code "
                                                          "can read from standard input using the input() function."},
                "input": {"type": "string", "description": "A string that will be provided as standard input to the "
                                                           "code when it calls input()."},
            },
            "required": ["code", "input"],
        },
    },
}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {"default": PYTHON_TOOL_SCHEMA, "release": RELEASE_TOOL_SCHEMA}

# The jupyter tool: the release names it and its one argument (SimJupyterTool, code_judge_utils); its schema
# text is ours (the release's jupyter tool config is not public), the same for both schema styles.
JUPYTER_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": JUPYTER_TOOL_NAME,
        "description": "Execute a cell of Python code in a stateful Jupyter-style session: variables, imports and "
                       "functions defined by earlier calls stay available. The value of the last expression is "
                       "printed. Use print() to output results.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python code of the next cell."},
            },
            "required": ["code"],
        },
    },
}


def tool_schema(tool: str, style: str) -> dict[str, Any]:
    """The schema of ``tool`` ("python" / "jupyter") in ``style`` (a ``TOOL_SCHEMAS`` key)."""
    return JUPYTER_TOOL_SCHEMA if tool == "jupyter" else TOOL_SCHEMAS[style]
