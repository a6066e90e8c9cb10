"""``jit_fast``: ``jax.jit`` with XLA's backend (LLVM) optimisation level 0, for tests whose cost is compiling.

The tests that compare two programs (chunked vs naive log-probs, blockwise/scanned/remat vs the dense
unrolled stack, packed vs padded rows, micro-batched vs one batch) are dominated by XLA's CPU compile
of tiny-shaped scanned, rematerialised backward passes (~11 s CPU for one such grad here, measured;
~5 s at level 0). The program traced from the model code is the same; level 0 turns down the
backend's optimisation of the code generated from it, so these tiny shapes run a little slower and
compile about twice as fast. Both sides of every comparison are compiled the same way, and the
tolerances are unchanged. Production code never uses it.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

FAST_COMPILE: dict[str, Any] = {"xla_backend_optimization_level": 0}


def jit_fast(fn: Callable, **kw: Any) -> Callable:
    """``jax.jit(fn, **kw)`` compiled with :data:`FAST_COMPILE`."""
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kw)
