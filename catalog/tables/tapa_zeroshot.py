"""TAPA Table 2: zero-shot PG-19 perplexity of the 8k-pretrained models (no 32k training)
(EXPERIMENTS §3.3).

Grid ``tapa_long_context`` (experiments/tapa_long_context.yaml): its ``ppl_zero_shot`` stage
evaluates each 8k-pretrained model (``pe`` = ``rope`` with b=5e5 | ``tapa``) at 1k ... 32k; rows
are (``pe``, stage role); metric ``ppl`` with ``task="pg19"``, ``split="test"``, ``context_len``.

The paper's PI and YaRN rows (factor 8 applied at inference, EXPERIMENTS §6 #22) are not rows
here: phaselab has no inference-only context extension yet (eval stages take no ``extend``
section and a fine-tune needs at least one step at a positive LR), so no grid produces them.
"""

from phaselab.catalog.tables.spec import Dim, TableSpec

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
_PAPER = {
    "rope": (13.08, 12.63, 12.32, 12.21, 5878.17, 16366.63),
    "tapa": (13.12, 12.66, 12.34, 12.22, 17.96, 122.71),
}

SPEC = TableSpec(
    name="tapa_table2",
    title="Zero-shot PG-19 test perplexity of the 8k-pretrained models",
    grid="tapa_long_context",
    rows=(Dim(field="axes.pe", title="Method", values=tuple(_PAPER),
              labels={"rope": "RoPE (b=5e5)", "tapa": "TAPA"}),
          Dim(field="role", title="Eval", values=("ppl_zero_shot",), labels={"ppl_zero_shot": "zero-shot"})),
    cols=Dim(field="context_len", values=CONTEXTS),
    metric="ppl", where={"task": "pg19", "split": "test"}, better="min", decimals=2, seeds=(0,),
    reference={(pe, "ppl_zero_shot"): dict(zip(CONTEXTS, v, strict=True)) for pe, v in _PAPER.items()},
    reference_source="TAPA (arXiv 2509.12635 v2) Table 2 (PI / YaRN rows not reproduced: no inference-only extension)",
)
