"""PoPE, OpenWebText: validation perplexity by model size (EXPERIMENTS §2.3).

Grid ``pope_owt_extrapolation`` (experiments/pope_owt_extrapolation.yaml); axes ``pe``, ``size``
(``124m`` | ``253m`` | ``774m``, the model presets ``owt-<size>``) and ``seed``; metric ``ppl`` of
its ``ppl_valid`` stage: ``task="openwebtext"``, ``split="valid"``, ``context_len=1024`` (whole
split, non-overlapping 1024-token windows). One seed, as the grid runs (the paper: single runs).
TAPA at this scale (EXPERIMENTS §3.5) needs its own LR axis and is not part of the paper grid.
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

# grid axis value (the preset suffix) -> the paper's label
SIZE_LABELS = {"124m": "124M", "253m": "253M", "774m": "774M"}

SPEC = TableSpec(
    name="pope_owt_ppl",
    title="OpenWebText: validation perplexity",
    grid="pope_owt_extrapolation",
    rows=(Dim(field="axes.pe", title="PE", values=("rope", "pope"), labels={"rope": "RoPE", "pope": "PoPE"}),),
    cols=Dim(field="axes.size", values=("124m", "253m", "774m"), labels=SIZE_LABELS),
    metric="ppl", where={"task": "openwebtext", "split": "valid", "context_len": 1024}, better="min",
    decimals=2, seeds=(0,),
    reference={("rope",): {"124m": 21.55, "253m": 18.88, "774m": 15.85},
               ("pope",): {"124m": 21.33, "253m": 18.55, "774m": 15.45}},
    reference_source="PoPE (arXiv 2509.10534), single runs",
)
