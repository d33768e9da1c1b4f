"""PoPE ablation on OpenWebText: validation perplexity (EXPERIMENTS §2.3, v3 Table 5; the 253M
column is not confirmed from the published text).

Grid ``pope_owt_ablation``; axes ``variant`` (``identity`` | ``relu`` | ``no_delta`` | ``full``),
``size`` and ``seed``; metric ``ppl`` with ``split="valid"``, ``context_len=1024``.
"""

from phaselab.catalog.tables.spec import Dim, TableSpec

SPEC = TableSpec(
    name="pope_owt_ablation",
    title="PoPE ablation: OpenWebText validation perplexity",
    grid="pope_owt_ablation",
    rows=(Dim(field="axes.variant", title="Variant", values=("identity", "relu", "no_delta", "full"),
              labels={"identity": "PoPE without softplus (identity)", "relu": "PoPE with ReLU amplitude",
                      "no_delta": "PoPE without δ", "full": "Full PoPE"}),),
    cols=Dim(field="axes.size", values=("124M", "253M")),
    metric="ppl", where={"split": "valid", "context_len": 1024}, better="min", decimals=2,
    reference={("identity",): {"124M": 21.57, "253M": 18.93}, ("relu",): {"124M": 21.55, "253M": 18.90},
               ("no_delta",): {"124M": 21.42, "253M": 18.57}, ("full",): {"124M": 21.33, "253M": 18.55}},
    reference_source="PoPE v3 Table 5 (253M column unconfirmed)",
)
