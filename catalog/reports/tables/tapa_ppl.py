"""TAPA Table 1: PG-19 test perplexity after 8k pretraining and 32k continued pretraining, by
context length (EXPERIMENTS §3.3; sliding window, stride 256).

Grid ``tapa_long_context`` (experiments/tapa_long_context.yaml). Each method is one eval stage
of that grid, so the rows are stage roles: ``ppl_rope_b5e5`` | ``ppl_rope_b2e8`` | ``ppl_pi`` |
``ppl_yarn`` (the RoPE cell's four 32k continued-pretraining variants) | ``ppl_tapa``; ``seed``
(the paper trained once: one seed expected); metric ``ppl`` with ``task="pg19"``,
``split="test"`` and ``context_len``.
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 49152, 65536)
ROLE_LABELS = {"ppl_rope_b5e5": "RoPE (b=5e5)", "ppl_rope_b2e8": "RoPE (b=2e8)", "ppl_pi": "PI",
               "ppl_yarn": "YaRN", "ppl_tapa": "TAPA"}
_PAPER = {
    "ppl_rope_b5e5": (12.97, 12.53, 12.22, 11.97, 11.79, 12.96, 938.23, 2280.16),
    "ppl_rope_b2e8": (13.00, 12.54, 12.23, 11.98, 11.80, 12.96, 942.94, 2284.72),
    "ppl_pi": (12.99, 12.54, 12.23, 11.98, 11.80, 12.97, 939.17, 2282.44),
    "ppl_yarn": (13.05, 12.60, 12.29, 12.03, 11.85, 12.16, 322.14, 1962.55),
    "ppl_tapa": (13.04, 12.62, 12.30, 12.07, 11.83, 11.74, 11.67, 11.75),
}

SPEC = TableSpec(
    name="tapa_table1",
    title="PG-19 test perplexity after 8k pretraining and 32k continued pretraining",
    grid="tapa_long_context",
    rows=(Dim(field="role", title="Method", values=tuple(_PAPER), labels=ROLE_LABELS),),
    cols=Dim(field="context_len", values=CONTEXTS),
    metric="ppl", where={"task": "pg19", "split": "test"}, better="min", decimals=2, seeds=(0,),
    reference={(role,): dict(zip(CONTEXTS, v, strict=True)) for role, v in _PAPER.items()},
    reference_source="TAPA (arXiv 2509.12635 v2) Table 1",
)
