"""PoPE, length extrapolation on PG-19: test perplexity by evaluation length 1024..10240
(EXPERIMENTS §2.4). The paper shows this as Figure 2 only, so there is no reference column.

Grid ``pope_pg19``; axes ``size``, ``variant`` (``rope`` | ``pope`` zero-shot, ``rope_yarn_ft`` |
``pope_ft`` fine-tuned at 4096) and ``seed``; metric ``ppl`` with ``task="pg19"``,
``split="test"`` and ``context_len`` = the evaluation length.
"""

from phaselab.catalog.tables.spec import Dim, TableSpec

SPEC = TableSpec(
    name="pope_pg19_extrapolation",
    title="PG-19 test perplexity by evaluation length (trained at 1024)",
    grid="pope_pg19",
    rows=(Dim(field="axes.size", title="Size", values=("124M", "253M", "774M")),
          Dim(field="axes.variant", title="Variant", values=("rope", "rope_yarn_ft", "pope", "pope_ft"),
              labels={"rope": "RoPE", "rope_yarn_ft": "RoPE+YaRN ft@4096", "pope": "PoPE",
                      "pope_ft": "PoPE+ft@4096"})),
    cols=Dim(field="context_len", values=tuple(1024 * k for k in range(1, 11))),
    metric="ppl", where={"task": "pg19", "split": "test"}, better="min", decimals=2, bold_group="axes.size",
)
