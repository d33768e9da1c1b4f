"""PoPE ablation on OpenWebText: validation perplexity (EXPERIMENTS §2.3, v3 Table 5; the 253M
column is not confirmed from the published text).

Grid ``pope_owt_ablation`` (experiments/pope_owt_ablation.yaml); axes ``variant`` (``identity`` |
``relu`` | ``no_delta`` | ``full``; ``pe`` holds the PoPE config), ``size`` (``124m`` | ``253m``)
and ``seed``; metric ``ppl`` of its ``ppl_valid`` stage: ``task="openwebtext"``,
``split="valid"``, ``context_len=1024``. One seed, as the grid runs.
"""

from phaselab.catalog.reports.tables.owt_ppl import SIZE_LABELS
from phaselab.catalog.reports.tables.spec import Dim, TableSpec

SPEC = TableSpec(
    name="pope_owt_ablation",
    title="PoPE ablation: OpenWebText validation perplexity",
    grid="pope_owt_ablation",
    rows=(Dim(field="axes.variant", title="Variant", values=("identity", "relu", "no_delta", "full"),
              labels={"identity": "PoPE without softplus (identity)", "relu": "PoPE with ReLU amplitude",
                      "no_delta": "PoPE without δ", "full": "Full PoPE"}),),
    cols=Dim(field="axes.size", values=("124m", "253m"), labels=SIZE_LABELS),
    metric="ppl", where={"task": "openwebtext", "split": "valid", "context_len": 1024}, better="min",
    decimals=2, seeds=(0,),
    reference={("identity",): {"124m": 21.57, "253m": 18.93}, ("relu",): {"124m": 21.55, "253m": 18.90},
               ("no_delta",): {"124m": 21.42, "253m": 18.57}, ("full",): {"124m": 21.33, "253m": 18.55}},
    reference_source="PoPE v3 Table 5 (253M column unconfirmed)",
)
