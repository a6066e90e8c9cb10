"""Discrete-event simulators (pure Python, no JAX): rollout dispatch on simulated engines under the
real admission policies (``simulate``; its inputs and running state in ``records``), the whole RL
loop, synchronous or overlapped (``simulate_async``: ``SimLoopConfig``, ``predict_step_s``), the
paper-scale cost model built on it (``paper_scale``), and the scripted long-tailed workload they and
the rollout benchmark share (``workload``)."""

from rstar2_jax.sim.records import SimEngine, SimGroup, SimResult, SimTrajectory
from rstar2_jax.sim.simulate import Simulator, simulate

__all__ = ["SimEngine", "SimGroup", "SimResult", "SimTrajectory", "Simulator", "simulate"]
