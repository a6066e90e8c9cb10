"""The rStar2-Agent recipe's command line (the run: ``rstar2_jax/run/recipe_main.py``).

    python experiments/rstar2_recipe.py --config experiments/configs/rstar2_14b.json [--out DIR] [--resume]
    python experiments/rstar2_recipe.py --dry-run     # every stage with a tiny random policy on CPU

``--help`` lists the flags: ``--config FILE`` is a ``RunSpec`` (JSON or YAML), ``--set FIELD=VALUE`` overrides one
spec field (dotted, repeatable: ``--set rl.loss.kind=gspo``); the run directory keeps ``run_spec.json``.
"""

import sys

from rstar2_jax.run.recipe_main import main

if __name__ == "__main__":
    main(sys.argv[1:])
