"""TAPA Table 3: phase-function ablation, PG-19 test perplexity (trained as for Table 1)
(EXPERIMENTS §3.3).

Grid ``tapa_phase`` (experiments/tapa_phase.yaml); axes ``phase`` (``linear`` | ``quadratic``,
i.e. ``tapa.phase``) and ``seed``; metric ``ppl`` of its ``ppl`` stage with ``task="pg19"``,
``split="test"`` and ``context_len``. The quadratic cell shares its stages with
tapa_long_context's TAPA cell (same content hashes).
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 49152, 65536)
_PAPER = {
    "linear": (14.63, 14.15, 13.83, 13.54, 13.29, 13.13, 13.59, 14.82),
    "quadratic": (13.04, 12.62, 12.30, 12.07, 11.83, 11.74, 11.67, 11.75),
}

SPEC = TableSpec(
    name="tapa_table3",
    title="TAPA phase-function ablation: PG-19 test perplexity",
    grid="tapa_phase",
    rows=(Dim(field="axes.phase", title="Phase", values=("linear", "quadratic"),
              labels={"linear": "Linear phase", "quadratic": "Quadratic phase"}),),
    cols=Dim(field="context_len", values=CONTEXTS),
    metric="ppl", where={"task": "pg19", "split": "test"}, better="min", decimals=2, seeds=(0,),
    reference={(ph,): dict(zip(CONTEXTS, v, strict=True)) for ph, v in _PAPER.items()},
    reference_source="TAPA (arXiv 2509.12635 v2) Table 3",
)
