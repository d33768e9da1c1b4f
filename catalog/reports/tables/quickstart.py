"""The quickstart demo (experiments/quickstart.yaml): char-level Tiny Shakespeare perplexity by
evaluation length, RoPE / PoPE / TAPA trained at 16 tokens, plus RoPE with a YaRN fine-tune at
32 (EXPERIMENTS §4, a miniature of §2.4).

Grid ``quickstart``; axes ``pe`` and ``seed``; rows are (``pe``, stage role) — ``ppl`` is the
zero-shot eval, ``ppl_yarn`` the eval of the YaRN fine-tune; metric ``ppl`` (``ppl-by-length``
suite) with ``context_len`` 16, 32, 64, 128.
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

# The shipped grid's data as the title names it; a table over other data names that instead
# (catalog/reports/tables/dataset.py).
DATASET = "Tiny Shakespeare"
SPEC = TableSpec(
    name="quickstart_ppl",
    title="Quickstart: Tiny Shakespeare perplexity by evaluation length (trained at 16)",
    grid="quickstart",
    rows=(Dim(field="axes.pe", title="PE", values=("rope", "pope", "tapa"),
              labels={"rope": "RoPE", "pope": "PoPE", "tapa": "TAPA"}),
          Dim(field="role", title="Model", values=("ppl", "ppl_yarn"),
              labels={"ppl": "pretrained", "ppl_yarn": "+ YaRN ft@32"})),
    row_keys=(("rope", "ppl"), ("rope", "ppl_yarn"), ("pope", "ppl"), ("tapa", "ppl")),
    cols=Dim(field="context_len", values=(16, 32, 64, 128)),
    metric="ppl", better="min", decimals=2, seeds=(0,),
)
