"""PoPE, OpenWebText: validation perplexity by model size (EXPERIMENTS §2.3).

Grid ``pope_owt``; axes ``pe``, ``size`` (``124M`` | ``253M`` | ``774M``) and ``seed``; metric
``ppl`` with ``split="valid"`` and ``context_len=1024`` (whole split, non-overlapping 1024-token
windows).
"""

from phaselab.catalog.tables.spec import Dim, TableSpec

SPEC = TableSpec(
    name="pope_owt_ppl",
    title="OpenWebText: validation perplexity",
    grid="pope_owt",
    rows=(Dim(field="axes.pe", title="PE", values=("rope", "pope", "tapa"),
              labels={"rope": "RoPE", "pope": "PoPE", "tapa": "TAPA"}),),
    cols=Dim(field="axes.size", values=("124M", "253M", "774M")),
    metric="ppl", where={"split": "valid", "context_len": 1024}, better="min", decimals=2,
    reference={("rope",): {"124M": 21.55, "253M": 18.88, "774M": 15.85},
               ("pope",): {"124M": 21.33, "253M": 18.55, "774M": 15.45}},
    reference_source="PoPE (arXiv 2509.10534), single runs",
)
