"""TAPA Table 2: zero-shot PG-19 perplexity of the 8k-pretrained models (no 32k training)
(EXPERIMENTS §3.3).

Grid ``tapa_long_context`` (experiments/tapa_long_context.yaml): its ``ppl_zero_shot`` stage
evaluates each 8k-pretrained model (``pe`` = ``rope`` with b=5e5 | ``tapa``) at 1k ... 32k; the
RoPE cell's ``ppl_zero_shot_yarn`` / ``ppl_zero_shot_pi`` stages evaluate the same checkpoint with
YaRN / PI at factor 8 (L = 8192) applied at inference only, through the eval stage's ``extend``
section (EXPERIMENTS §6 #22: the paper does not say how it configured them without fine-tuning).
Rows are (``pe``, stage role) in the paper's order; metric ``ppl`` with ``task="pg19"``,
``split="test"``, ``context_len``.
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
_PAPER = {
    ("rope", "ppl_zero_shot"): (13.08, 12.63, 12.32, 12.21, 5878.17, 16366.63),
    ("rope", "ppl_zero_shot_yarn"): (13.09, 12.64, 12.33, 12.22, 5869.35, 16342.28),
    ("rope", "ppl_zero_shot_pi"): (13.07, 12.62, 12.30, 12.19, 5872.29, 16350.28),
    ("tapa", "ppl_zero_shot"): (13.12, 12.66, 12.34, 12.22, 17.96, 122.71),
}
ROLE_LABELS = {"ppl_zero_shot": "zero-shot", "ppl_zero_shot_yarn": "YaRN x8 at inference",
               "ppl_zero_shot_pi": "PI x8 at inference"}

SPEC = TableSpec(
    name="tapa_table2",
    title="Zero-shot PG-19 test perplexity of the 8k-pretrained models",
    grid="tapa_long_context",
    rows=(Dim(field="axes.pe", title="Method", values=("rope", "tapa"),
              labels={"rope": "RoPE (b=5e5)", "tapa": "TAPA"}),
          Dim(field="role", title="Eval", values=tuple(ROLE_LABELS), labels=ROLE_LABELS)),
    row_keys=tuple(_PAPER),       # PI / YaRN exist for the RoPE cell only
    cols=Dim(field="context_len", values=CONTEXTS),
    metric="ppl", where={"task": "pg19", "split": "test"}, better="min", decimals=2, seeds=(0,),
    reference={key: dict(zip(CONTEXTS, v, strict=True)) for key, v in _PAPER.items()},
    reference_source="TAPA (arXiv 2509.12635 v2) Table 2",
)
