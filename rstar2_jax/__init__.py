"""rstar2_jax: rStar2-Agent (agentic RL for math reasoning with GRPO-RoC) in JAX.

Importing the top-level package must not import JAX: ``rstar2_jax.sandbox`` and
``rstar2_jax.rewards`` run in CPU worker processes that never load JAX.
"""

__version__ = "0.1.0"
