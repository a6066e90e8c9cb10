"""Running a training job: the driver shared by the demo and the recipe (``driver``), and the
cursor, seeds and resume rules (``resume``)."""
