"""One engine workload, run against a reference engine by the TP and kernel tests (``test_tp_engine``,
``test_ragged_kernel_engine``): mixed prompt lengths (chunks inside mixed windows), a forked group
(copy-on-write page copies), greedy and sampled rows, and a sequence paused and resumed with appended
tokens (a tool response) while others still decode."""

import numpy as np

from rstar2_jax.sampling import Greedy, Request, Temperature

# (prompt length, max new tokens, greedy) of the single requests
ROWS = ((1, 7, True), (3, 12, False), (9, 5, True), (17, 9, False), (6, 4, False))


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 128, size=n).tolist()


def run_workload(engine, greedy: tuple[int, ...] = ()):
    """Runs the workload on ``engine``; returns (events ``(seq_id, tokens, logprobs, reason)`` in order,
    engine stats). ``greedy``: indices into ``ROWS`` decoded greedily whatever ``ROWS`` says."""
    for i, (n, m, g) in enumerate(ROWS):
        engine.submit(Request(prompt=prompt(n, n), key=n, max_new_tokens=m,
                              sampler=Greedy() if g or i in greedy else Temperature(temperature=1.0)))
    group = engine.submit_group(Request(prompt=prompt(10, 100), key=1, max_new_tokens=8,
                                        sampler=Temperature(temperature=1.0)), 3)
    out, resumed = [], False
    while engine.has_work():
        for ev in engine.step():
            out.append((ev.seq_id, ev.tokens, ev.logprobs, ev.reason))
            if ev.seq_id == group[0] and not resumed:
                engine.resume(ev.seq_id, prompt(5, 7), max_new_tokens=6)
                resumed = True
    return out, engine.stats()
