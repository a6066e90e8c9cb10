"""The main job (``make demo``): SFT a tiny policy from scratch, then GRPO-RoC, on CPU (``rstar2_jax.run.demo``).

    python experiments/toy_tool_math.py [--config FILE] [--set FIELD=VALUE ...] [--out DIR] [--resume]

The run is the ``demo`` preset (``rstar2_jax/run/presets.py``) with the file's and the command line's
overrides; the demo's older flags (``--budget``, ``--loss-kind``, ...) are aliases of spec fields
(``rstar2_jax/run/demo_cli.py: ALIASES``). ``--help`` lists them all.
"""

import sys

from rstar2_jax.run.demo_cli import parse_args, use_host_devices  # JAX's backend is not started by these

if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    use_host_devices(args.spec, who="toy_tool_math")  # before the backend starts
    from rstar2_jax.run.demo import run_demo

    run_demo(args)
