"""Tracking. ``interface`` is the tracker interface, the only part of ``phaselab.catalog`` that
workloads may import; this package re-exports it. The MLflow side (``mlflow_tracker``,
``mlflow_experiment``, ``mlflow_summary``, ``mlflow_common``, ``mlflow_server``, ``lineage``) is
imported by the orchestrator only."""

from phaselab.catalog.tracking.interface import (
    FanoutTracker,
    MetricRecord,
    NullTracker,
    RecordingTracker,
    Tracker,
)

__all__ = ["FanoutTracker", "MetricRecord", "NullTracker", "RecordingTracker", "Tracker"]
