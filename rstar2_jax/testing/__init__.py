"""Test and benchmark support inside the package (tests and ``experiments/`` import it; it imports
nothing from either): the rollout benchmark's engine host (``engine_host``: a real engine per process
playing ``sim.workload``'s scripted behaviour), the verifier's case tables
(``reward_cases``, ``mv_style_cases``), and the test doubles of an engine: a scripted policy
(``scripted``) and a static-batch dense-cache sampler with a naive recompute decoder (``dense_sampler``)."""
