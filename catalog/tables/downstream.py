"""PoPE, zero-shot downstream accuracy (%) with lm-eval (EXPERIMENTS §2.5).

Grid ``pope_downstream``; axes ``size``, ``pe`` and ``seed``; metric ``acc`` (fraction) per
``task``: ``lambada_openai``, ``blimp`` (mean over its 67 sub-tasks), ``cbt`` = mean of
``cbt_cn`` and ``cbt_ne`` (phaselab's CBT decision), ``hellaswag``, ``piqa``, ``arc_easy``
(``acc``, not ``acc_norm``: ``eval.mc_metric``). ``Avg`` is the mean of the six columns.
"""

from phaselab.catalog.tables.spec import Dim, TableSpec

_TASKS = ("lambada_openai", "blimp", "cbt", "hellaswag", "piqa", "arc_easy")
_PAPER = {
    ("124M", "rope"): (28.74, 77.55, 38.80, 29.55, 60.28, 37.08, 45.33),
    ("124M", "pope"): (27.67, 77.75, 44.43, 29.18, 59.58, 38.52, 46.19),
    ("253M", "rope"): (31.38, 79.12, 48.51, 31.47, 62.24, 39.87, 48.76),
    ("253M", "pope"): (30.47, 80.01, 49.39, 31.82, 61.70, 39.32, 48.78),
    ("774M", "rope"): (35.95, 81.05, 52.56, 35.39, 63.55, 42.28, 51.80),
    ("774M", "pope"): (36.89, 82.03, 53.67, 35.86, 63.93, 42.37, 52.46),
}

SPEC = TableSpec(
    name="pope_downstream",
    title="Zero-shot downstream accuracy (%)",
    grid="pope_downstream",
    rows=(Dim(field="axes.size", title="Size", values=("124M", "253M", "774M")),
          Dim(field="axes.pe", title="PE", values=("rope", "pope"), labels={"rope": "RoPE", "pope": "PoPE"})),
    cols=Dim(field="task", values=_TASKS,
             labels={"lambada_openai": "LAMBADA", "blimp": "BLiMP", "cbt": "CBT", "hellaswag": "HellaSwag",
                     "piqa": "PIQA", "arc_easy": "ARC-E"}),
    combine={"cbt": ("cbt_cn", "cbt_ne")},
    metric="acc", better="max", scale=100.0, decimals=2, summary_col="Avg", bold_group="axes.size",
    reference={k: dict(zip(_TASKS + ("Avg",), v, strict=True)) for k, v in _PAPER.items()},
    reference_source="PoPE (arXiv 2509.10534), single runs",
)
