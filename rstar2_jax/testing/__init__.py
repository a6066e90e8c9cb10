"""Test and benchmark support inside the package (tests and ``experiments/`` import it; it imports
nothing from either): the rollout benchmark's scripted workload (``workload``: pure, no JAX) and its
engine host (``engine_host``: a real engine per process), and the verifier's case tables
(``reward_cases``, ``mv_style_cases``)."""
