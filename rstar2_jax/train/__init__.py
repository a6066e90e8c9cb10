"""Training: the learner (``learner``: RoC selection, advantages, the batch, the jitted update), one
RL step's body shared by the synchronous and asynchronous loops (``step``), the asynchronous loop
(``async_loop``), SFT (``sft``) and the trajectory statistics every step records (``stats``)."""
