"""Deployment over many engines: where engines run on a process's devices (``placement``), trainer
weights to every engine's layout device to device (``weight_sync``), one engine per device behind one
``Engine`` (``data_parallel``: ``DataParallelEngine``) and an engine in its own process
(``engine_proc``: ``ProcessEngine``). One engine's internals are ``rstar2_jax.sampling``."""

from rstar2_jax.deploy.data_parallel import DataParallelEngine

__all__ = ["DataParallelEngine"]
