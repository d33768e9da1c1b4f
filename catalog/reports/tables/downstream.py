"""PoPE, zero-shot downstream accuracy (%) with lm-eval (EXPERIMENTS §2.5).

Grid ``pope_owt_extrapolation`` (experiments/pope_owt_extrapolation.yaml: its
``zero_shot_lm_eval`` stage runs lm-eval on the pretrained OpenWebText models); axes ``size``
(``124m`` | ``253m`` | ``774m``), ``pe`` and ``seed``; metric ``acc`` (fraction) per lm-eval
``task``: ``lambada_openai``, ``phaselab_blimp`` (the offline bundle's group: mean over its 67
sub-tasks), CBT = mean of ``phaselab_cbt_cn`` and ``phaselab_cbt_ne`` (phaselab's CBT decision),
``hellaswag``, ``piqa``, ``arc_easy`` (``acc``, not ``acc_norm``: ``eval.mc_metric``). ``Avg`` is
the mean of the six columns. One seed, as the grid runs (the paper: single runs).
"""

from phaselab.catalog.reports.tables.owt_ppl import SIZE_LABELS
from phaselab.catalog.reports.tables.spec import Dim, TableSpec

_TASKS = ("lambada_openai", "phaselab_blimp", "cbt", "hellaswag", "piqa", "arc_easy")
_PAPER = {
    ("124m", "rope"): (28.74, 77.55, 38.80, 29.55, 60.28, 37.08, 45.33),
    ("124m", "pope"): (27.67, 77.75, 44.43, 29.18, 59.58, 38.52, 46.19),
    ("253m", "rope"): (31.38, 79.12, 48.51, 31.47, 62.24, 39.87, 48.76),
    ("253m", "pope"): (30.47, 80.01, 49.39, 31.82, 61.70, 39.32, 48.78),
    ("774m", "rope"): (35.95, 81.05, 52.56, 35.39, 63.55, 42.28, 51.80),
    ("774m", "pope"): (36.89, 82.03, 53.67, 35.86, 63.93, 42.37, 52.46),
}

SPEC = TableSpec(
    name="pope_downstream",
    title="Zero-shot downstream accuracy (%)",
    grid="pope_owt_extrapolation",
    rows=(Dim(field="axes.size", title="Size", values=("124m", "253m", "774m"), labels=SIZE_LABELS),
          Dim(field="axes.pe", title="PE", values=("rope", "pope"), labels={"rope": "RoPE", "pope": "PoPE"})),
    cols=Dim(field="task", values=_TASKS,
             labels={"lambada_openai": "LAMBADA", "phaselab_blimp": "BLiMP", "cbt": "CBT", "hellaswag": "HellaSwag",
                     "piqa": "PIQA", "arc_easy": "ARC-E"}),
    combine={"cbt": ("phaselab_cbt_cn", "phaselab_cbt_ne")},
    metric="acc", better="max", seeds=(0,), scale=100.0, decimals=2, summary_col="Avg", bold_group="axes.size",
    reference={k: dict(zip(_TASKS + ("Avg",), v, strict=True)) for k, v in _PAPER.items()},
    reference_source="PoPE (arXiv 2509.10534), single runs",
)
