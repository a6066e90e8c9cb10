"""The notebook-like wrapper, in-process: the cheap split agrees with the ast reference; messages."""

from __future__ import annotations

import pytest

from rstar2_jax.sandbox import wrapper

SNIPPETS = [
    "1 + 1",
    "x = 3\nx * 2",
    "print('hi')",
    "x = 5",
    "x = 1; x",
    "x = 1; y = 2",
    "import math\nmath.sqrt(16)\n\n# trailing comment\n",
    "def f(a):\n    return a\nf(3)",
    "def f(a):\n    return a",
    "for i in range(3):\n    i",
    "if True:\n    5\nelse:\n    6",
    "(1 +\n2)",
    "x = (1 +\n2)",
    "foo = [\n1,\n2,\n]",
    "[\n1,\n2,\n]",
    "s = '''\n1\n'''",
    "s = '''\n1\n'''\ns",
    "x = 1 + \\\n2",
    "x = 1\n\"\"\"doc\ny\"\"\"",
    "@staticmethod\ndef f(): pass",
    "class A:\n    pass\nA()",
    "try:\n    1/0\nexcept ZeroDivisionError:\n    0",
    "with open('/dev/null') as f:\n    pass",
    "x = 1\r\nx\r\n",
    "from __future__ import annotations\nx: int = 1\nx",
    "lambda: 1",
    "await_ = 1\nawait_",
    "x = {'a': 1}\nx['a']",
    "print(1)\n    ",
    "",
    "# only a comment",
    "\n\n",
    "async def f(): pass\nf",
    "x = [i for i in range(3)]\nx",
    "if x := 3:\n    pass\nx",
    "y = 2\n-y",
    "y = 2\ny if y else 0",
]


@pytest.mark.parametrize("code", SNIPPETS)
def test_cheap_split_agrees_with_ast(code: str) -> None:
    fast = wrapper.split_last_expression(code)
    ref = wrapper.parse_last_expression(code)
    if fast is not None:
        assert fast[0] == ref[0], code


def _run(code: str, capsys) -> tuple[str, str, int]:
    import sys
    import types

    saved, saved_finish = sys.modules["__main__"], wrapper._finish
    sys.modules["__main__"] = types.ModuleType("__main__")
    # execute() ends like an interpreter exit (atexit handlers, thread joins): in a sandbox child that
    # is right, in this pytest process it would run everyone's atexit handlers (and close stderr)
    wrapper._finish = lambda: (sys.stdout.flush(), sys.stderr.flush())
    try:
        status = wrapper.execute(code, True)
    finally:
        sys.modules["__main__"], wrapper._finish = saved, saved_finish
    out, err = capsys.readouterr()
    return out, err, status


@pytest.mark.parametrize("code, out", [
    ("1 + 1", "2\n"), ("'a'", "'a'\n"), ("None", ""), ("x = 5", ""), ("x = 1; x", "1\n"),
    ("print('p')\n[1, 2]", "p\n[1, 2]\n"), ("(1 +\n2)", "3\n"), ("if True:\n    7", ""),
])
def test_last_expression_is_printed_with_repr(code: str, out: str, capsys) -> None:
    assert _run(code, capsys) == (out, "", 0)


@pytest.mark.parametrize("code, err", [
    ("x = 1\ny", "NameError at line 2: name 'y' is not defined\n"),
    ("1/0", "ZeroDivisionError at line 1: division by zero\n"),
    ("def f():\n    raise ValueError('bad')\n\nf()", "ValueError at line 2: bad\n"),
    ("x = (", "SyntaxError at line 1: '(' was never closed\n"),
    ("import json\njson.loads('{')", "JSONDecodeError at line 2: Expecting property name enclosed in double "
                                    "quotes: line 1 column 2 (char 1)\n"),
])
def test_exception_message_and_exit_status(code: str, err: str, capsys) -> None:
    assert _run(code, capsys) == ("", err, 1)


def test_system_exit_codes(capsys) -> None:
    assert _run("import sys\nsys.exit(3)", capsys)[2] == 3
    assert _run("import sys\nsys.exit()", capsys)[2] == 0
    assert _run("import sys\nsys.exit('bye')", capsys) == ("", "bye\n", 1)


def test_cheap_split_agrees_with_ast_on_random_programs() -> None:
    import random

    rng = random.Random(0)
    checked = 0
    for _ in range(3000):
        code = "\n".join(rng.choice(SNIPPETS) for _ in range(rng.randint(1, 4)))
        try:
            ref = wrapper.parse_last_expression(code)
        except SyntaxError:
            continue
        fast = wrapper.split_last_expression(code)
        if fast is not None:
            checked += 1
            assert fast[0] == ref[0], code
    assert checked > 500
