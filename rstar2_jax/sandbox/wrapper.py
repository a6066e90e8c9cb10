"""Run user code inside the call's process: the rStar2 notebook-like wrapper and plain ``python -c`` mode.

``execute`` is called in the fresh forked child after its limits are in place and returns the exit status;
the caller then leaves with ``os._exit``. The module is imported once per worker, so a call pays nothing
for it.

Wrapped mode (rStar2-Agent's tool): the last statement, when it is an expression, is evaluated and its
``repr`` printed (unless it is ``None``); an uncaught exception prints ``<ExceptionName> at line <N>:
<message>`` to stderr and exits 1, N being the line of the user's code where it was raised.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import sys
import threading
import traceback
import types

FILENAME = "<code>"  # file name of wrapped code in tracebacks
PLAIN_FILENAME = "<string>"  # as for ``python -c``


def _user_line(exc: BaseException) -> int | None:
    """Line of the innermost frame of the user's code in the exception's traceback."""
    if isinstance(exc, SyntaxError) and exc.filename == FILENAME:
        return exc.lineno
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def format_exception(exc: BaseException) -> str:
    """``Name at line N: message`` (``Name: message`` when no line of the user's code is involved)."""
    name = type(exc).__name__
    message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    line = _user_line(exc)
    where = f" at line {line}" if line is not None else ""
    return f"{name}{where}: {message}"


def split_last_expression(code: str) -> tuple[bool, list] | None:
    """Cheap path: compile ``code`` as (head statements, last top-level line group) without building an AST.

    The last group starts at the last line that begins in column 0; when the head compiles on its own and
    the group compiles as one expression (or as one ``;``-free statement), that split is the real one.
    Returns (last is an expression, [code objects]) or None when unsure (use ``parse_last_expression``).
    """
    lines = code.split("\n")
    j = len(lines) - 1
    while j >= 0 and (not lines[j] or lines[j][0] in " \t#\f\r"):
        j -= 1
    if j < 0 or "__future__" in code:
        return None
    k = len(lines)  # drop trailing blank and comment-only lines (eval mode rejects a trailing indent)
    while k > j + 1 and (not lines[k - 1].strip() or lines[k - 1].lstrip().startswith("#")):
        k -= 1
    head, tail = "\n".join(lines[:j]), "\n" * j + "\n".join(lines[j:k])
    try:
        head_code = compile(head, FILENAME, "exec")
    except (SyntaxError, ValueError):
        return None
    try:
        return True, [head_code, compile(tail, FILENAME, "eval")]
    except SyntaxError:
        pass
    if ";" in lines[j]:  # ``x = 1; y``: the last statement may be an expression
        return None
    try:
        return False, [head_code, compile(tail, FILENAME, "exec")]
    except (SyntaxError, ValueError):
        return None


def parse_last_expression(code: str) -> tuple[bool, list]:
    """Reference path with ``ast``: (last statement is an expression, [code objects]); raises SyntaxError."""
    tree = ast.parse(code, FILENAME, "exec")
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        return True, [compile(tree, FILENAME, "exec"), compile(last, FILENAME, "eval")]
    return False, [compile(tree, FILENAME, "exec")]


def _run_wrapped(code: str, namespace: dict) -> None:
    split = split_last_expression(code) or parse_last_expression(code)
    is_expr, codes = split
    if is_expr:
        exec(codes[0], namespace)
        value = eval(codes[1], namespace)
        if value is not None:
            print(repr(value))
    else:
        for c in codes:
            exec(c, namespace)


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish() -> None:
    """What the interpreter does at exit: join non-daemon threads, run atexit handlers, flush."""
    try:
        if len(threading._active) > 1:  # type: ignore[attr-defined]
            threading._shutdown()  # type: ignore[attr-defined]
        if atexit._ncallbacks():
            atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - never let cleanup change the status
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass


def prepare_main() -> None:
    """Once in the worker's init: an empty ``__main__`` for the calls (each call's fork has its own copy)."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv[:] = ["-c"]


class _Discard:
    """A text stream that drops what is written (replayed cells' output)."""

    encoding, errors = "utf-8", "strict"

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def replay(history: tuple[str, ...], namespace: dict) -> None:
    """The release's replay (``SimJupyterTool``, docs/design.md §3.3): run each earlier cell in ``namespace``
    with ``sys.stdout``/``sys.stderr`` discarded and its last expression evaluated but not shown; an
    ``Exception`` ends that cell and is ignored (``SystemExit`` and ``KeyboardInterrupt`` are not: they end
    the process, as in the release). Output written to the file descriptors (a subprocess) is not discarded."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = _Discard()
    try:
        for cell in history:
            try:
                is_expr, codes = split_last_expression(cell) or parse_last_expression(cell)
                for i, c in enumerate(codes):
                    (eval if is_expr and i == len(codes) - 1 else exec)(c, namespace)
            except Exception:  # noqa: BLE001 - the release ignores a replayed cell's error
                pass
    finally:
        sys.stdout, sys.stderr = out, err


def run_cell(code: str, namespace: dict) -> int:
    """One cell of a persistent session (``session.py``): wrapped mode in ``namespace``, which the next cell
    sees. Returns 0, 1 (an uncaught exception, reported as in ``execute``) or a ``SystemExit``'s status
    (the session goes on). Threads the cell started keep running; nothing is joined or flushed at exit."""
    try:
        _run_wrapped(code, namespace)
        return 0
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - the user's error is the result
        try:
            print(format_exception(exc), file=sys.stderr)
        except BaseException:  # noqa: BLE001 - e.g. MemoryError while formatting
            pass
        return 1


def execute(code: str, wrap: bool, history: tuple[str, ...] = ()) -> int:
    """Run ``code`` in ``__main__`` (see ``prepare_main``), after replaying ``history`` (``replay``);
    return the exit status (0 ok, 1 uncaught error)."""
    namespace = sys.modules["__main__"].__dict__  # see prepare_main
    try:
        if history:
            replay(history, namespace)
        if wrap:
            _run_wrapped(code, namespace)
        else:
            exec(compile(code, PLAIN_FILENAME, "exec"), namespace)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - the user's error is the result
        try:
            if wrap:
                print(format_exception(exc), file=sys.stderr)
            else:
                tb = exc.__traceback__  # drop this module's frames, as ``python -c`` shows none
                while tb is not None and tb.tb_frame.f_code.co_filename != PLAIN_FILENAME:
                    tb = tb.tb_next
                traceback.print_exception(type(exc), exc, tb)
        except BaseException:  # noqa: BLE001 - e.g. MemoryError while formatting
            pass
        status = 1
    _finish()
    return status
