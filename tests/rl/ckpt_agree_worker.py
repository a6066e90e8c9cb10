"""Subprocess for tests/rl/test_rl_checkpoint_agree.py (not a test module): each of 2 processes (1 CPU
device each) saves steps 1..3 of an array sharded over both into one folder, then restores it in cases
where process 1 alone sees a problem; every case's outcome goes to ``OUT/proc{i}.json``.

  python ckpt_agree_worker.py FOLDER OUT
"""

import json
import os
import sys
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rstar2_jax import distributed  # noqa: E402

distributed.initialize(initialization_timeout=60)  # before any other JAX call

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import rstar2_jax.rl.checkpoint as ck  # noqa: E402


def main(folder: str, out: str) -> None:
    warnings.simplefilter("ignore")
    sh = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), PartitionSpec("x"))
    me = jax.process_index()
    with ck.Checkpointer(folder, max_to_keep=3) as ckpt:
        for k in (1, 2, 3):
            w = jax.make_array_from_callback((8, 4), sh, lambda idx, k=k: np.full((8, 4), float(k), np.float32)[idx])
            ckpt.save({"w": w}, step=k, data_cursor=k)
    results = {}

    def case(name, shape=(8, 4)):
        with ck.Checkpointer(folder, max_to_keep=3) as ckpt:
            if me == 1 and name == "broken":  # process 1 alone finds step 3's files broken
                check = ckpt._local_problem
                ckpt._local_problem = lambda s: "its meta is unreadable here (test)" if s == 3 else check(s)
            if me == 1 and name == "lacking":  # process 1 alone does not list step 3
                ckpt.all_steps = lambda: [1, 2]
            r = ckpt.restore({"w": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sh)})
            results[name] = {"step": None if r is None else r.step, "failures": {str(s): why[:120] for s, why in
                                                                                 ckpt.failures.items()},
                             "local": None if r is None else [float(np.asarray(x.data).mean())
                                                              for x in r.state["w"].addressable_shards]}

    case("plain")
    case("broken")
    case("lacking")
    real = ck._matches
    seen = []
    if me == 1:  # process 1 alone: step 3's arrays do not match the fingerprint (the second round)
        ck._matches = lambda a, b, **k: seen.append(1) is None and len(seen) > 1 and real(a, b, **k)
    case("fingerprint")
    ck._matches = real
    case("shape", shape=(8, 2))  # every process fails every step alike: none restores
    with open(os.path.join(out, f"proc{me}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
