"""``rstar2_jax.utils.xla_flags``: the fake device count is added to the user's XLA_FLAGS, never
replacing them; a count the user set is kept, and said when it is not the one the script needs."""

import io

import pytest

from rstar2_jax.utils.xla_flags import device_count_in, force_host_device_count, with_device_count

pytestmark = pytest.mark.fast

FLAG = "--xla_force_host_platform_device_count"


@pytest.mark.parametrize("flags,expected", [
    ("", None), (None, None), ("--xla_dump_to=/tmp/d", None),
    (f"{FLAG}=4", "4"), (f"--xla_dump_to=/tmp/d {FLAG}=4", "4"),
    (f"{FLAG}=4 {FLAG}=2", "2"),  # the last one wins, as in XLA's parser
    ("-xla_force_host_platform_device_count=3", "3"), (f"{FLAG}", ""),
    (f"{FLAG}_extra=5", None),  # another flag whose name starts the same
    (f"--xla_gpu_x=1\t{FLAG}=6\n", "6"),
])
def test_device_count_in(flags, expected):
    assert device_count_in(flags) == expected


def test_appended_to_the_users_flags():
    assert with_device_count("", 8) == (f"{FLAG}=8", None)
    assert with_device_count(None, 2) == (f"{FLAG}=2", None)
    assert with_device_count("  --xla_dump_to=/tmp/d  ", 8) == (f"--xla_dump_to=/tmp/d {FLAG}=8", None)
    assert with_device_count(f"--xla_dump_to=/tmp/d {FLAG}=3", 8) == (f"--xla_dump_to=/tmp/d {FLAG}=3", "3")
    with pytest.raises(ValueError, match="positive int"):
        with_device_count("", 0)


def test_force_keeps_the_users_count_and_says_when_it_differs():
    env, err = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}, io.StringIO()
    assert force_host_device_count(4, environ=env, stream=err) == 4
    assert env["XLA_FLAGS"] == f"--xla_cpu_enable_fast_math=false {FLAG}=4" and err.getvalue() == ""

    env = {}
    assert force_host_device_count(2, environ=env, stream=err) == 2 and env["XLA_FLAGS"] == f"{FLAG}=2"

    env = {"XLA_FLAGS": f"{FLAG}=4"}
    assert force_host_device_count(4, environ=env, stream=err) == 4 and err.getvalue() == ""  # the same: silent

    env = {"XLA_FLAGS": f"--xla_dump_to=/d {FLAG}=3"}
    assert force_host_device_count(8, environ=env, stream=err, who="toy_tool_math") == 3
    assert env["XLA_FLAGS"] == f"--xla_dump_to=/d {FLAG}=3"
    assert err.getvalue().startswith(f"toy_tool_math: XLA_FLAGS already sets {FLAG}=3: keeping it")
    assert "asks for 8 devices" in err.getvalue()
