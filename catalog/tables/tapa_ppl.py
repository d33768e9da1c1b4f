"""TAPA Table 1: PG-19 test perplexity after 8k pretraining and 32k continued pretraining, by
context length (EXPERIMENTS §3.3; sliding window, stride 256).

Grid ``tapa_pg19``; axes ``pe`` (``rope_5e5`` | ``rope_2e8`` | ``pi`` | ``yarn`` | ``tapa``) and
``seed`` (the paper trained once: one seed expected); metric ``ppl`` with ``task="pg19"``,
``split="test"`` and ``context_len``.
"""

from phaselab.catalog.tables.spec import Dim, TableSpec

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 49152, 65536)
PE_LABELS = {"rope_5e5": "RoPE (b=5e5)", "rope_2e8": "RoPE (b=2e8)", "pi": "PI", "yarn": "YaRN",
             "tapa": "TAPA"}
_PAPER = {
    "rope_5e5": (12.97, 12.53, 12.22, 11.97, 11.79, 12.96, 938.23, 2280.16),
    "rope_2e8": (13.00, 12.54, 12.23, 11.98, 11.80, 12.96, 942.94, 2284.72),
    "pi": (12.99, 12.54, 12.23, 11.98, 11.80, 12.97, 939.17, 2282.44),
    "yarn": (13.05, 12.60, 12.29, 12.03, 11.85, 12.16, 322.14, 1962.55),
    "tapa": (13.04, 12.62, 12.30, 12.07, 11.83, 11.74, 11.67, 11.75),
}

SPEC = TableSpec(
    name="tapa_table1",
    title="PG-19 test perplexity after 8k pretraining and 32k continued pretraining",
    grid="tapa_pg19",
    rows=(Dim(field="axes.pe", title="Method", values=tuple(_PAPER), labels=PE_LABELS),),
    cols=Dim(field="context_len", values=CONTEXTS),
    metric="ppl", where={"task": "pg19", "split": "test"}, better="min", decimals=2, seeds=(0,),
    reference={(pe,): dict(zip(CONTEXTS, v, strict=True)) for pe, v in _PAPER.items()},
    reference_source="TAPA (arXiv 2509.12635 v2) Table 1",
)
