"""Running a plan: the controller loop (``controller``, with its MLflow side in
``mlflow_runs``), what runs inside a stage's Ray task (``runner``), failure classes and retries
(``failures``), Ray connection and clean-up (``ray_local``,
``reaper``), live progress (``progress``), notifications (``notify``), job submission (``jobs``),
checkpoint retention (``gc``) and re-running a stage's first steps (``verify``)."""
