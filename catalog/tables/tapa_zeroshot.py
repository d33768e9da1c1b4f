"""TAPA Table 2: zero-shot PG-19 perplexity of the 8k-pretrained models (no 32k training; PI and
YaRN with factor 8 at inference) (EXPERIMENTS §3.3).

Grid ``tapa_pg19_zeroshot``; same axes and metric as :mod:`tapa_ppl`.
"""

from phaselab.catalog.tables.spec import Dim, TableSpec
from phaselab.catalog.tables.tapa_ppl import PE_LABELS

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
_PAPER = {
    "rope_5e5": (13.08, 12.63, 12.32, 12.21, 5878.17, 16366.63),
    "yarn": (13.09, 12.64, 12.33, 12.22, 5869.35, 16342.28),
    "pi": (13.07, 12.62, 12.30, 12.19, 5872.29, 16350.28),
    "tapa": (13.12, 12.66, 12.34, 12.22, 17.96, 122.71),
}

SPEC = TableSpec(
    name="tapa_table2",
    title="Zero-shot PG-19 test perplexity of the 8k-pretrained models",
    grid="tapa_pg19_zeroshot",
    rows=(Dim(field="axes.pe", title="Method", values=tuple(_PAPER), labels=PE_LABELS),),
    cols=Dim(field="context_len", values=CONTEXTS),
    metric="ppl", where={"task": "pg19", "split": "test"}, better="min", decimals=2, seeds=(0,),
    reference={(pe,): dict(zip(CONTEXTS, v, strict=True)) for pe, v in _PAPER.items()},
    reference_source="TAPA (arXiv 2509.12635 v2) Table 2",
)
