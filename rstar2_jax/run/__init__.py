"""Running a training job: the driver shared by the demo and the recipe (``driver``), the cursor,
step seeds and resume rules (``resume``), and the mixed scripted policy of tests and dry-runs
(``scripted``)."""
