"""Evaluation with lm-evaluation-harness: checkpoint preflight and loading (``checkpoints``), the run
(``runner``), the report (``report``), task resolution and the offline sets (``tasks``, ``offline/``)."""
