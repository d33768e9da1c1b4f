"""PoPE, Indirect Indexing: test accuracy (%) by positional encoding (EXPERIMENTS §2.1;
PoPE v2 Tables 6/7 = v3 Tables 7/8, last four rows from v3 appendix Table 9).

Grid ``pope_indirect_indexing`` (experiments/pope_indirect_indexing.yaml); axes ``variant`` (the
row label; ``pe`` holds the encoding's config) and ``seed``; metric ``acc`` (fraction, exact match
on the target token) with ``task="indirect_indexing"``, ``split="test"`` from the ``test_acc`` stage
(the ``task`` eval suite); ``step=None`` keeps out the training stage's own final evaluation,
which also records ``acc`` on the test split (with its step). The paper reports the final
accuracy, so the grid evaluates the final checkpoint (no ``select``; a best_valid eval would
carry the table's ``†`` mark).
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

SPEC = TableSpec(
    name="pope_indirect_indexing",
    title="Indirect Indexing: test accuracy (%)",
    grid="pope_indirect_indexing",
    rows=(Dim(field="axes.variant", title="PE",
              values=("rope", "pope", "rope_half", "alibi_half", "learned", "sinusoidal"),
              labels={"rope": "RoPE", "pope": "PoPE", "rope_half": "RoPE half-channels",
                      "alibi_half": "ALiBi half-heads", "learned": "Learned absolute",
                      "sinusoidal": "Sinusoidal"}),),
    cols=Dim(field="task", values=("indirect_indexing",), labels={"indirect_indexing": "Accuracy (%)"}),
    metric="acc", where={"split": "test", "step": None}, better="max", scale=100.0, decimals=2,
    reference={("rope",): {"indirect_indexing": (11.16, 2.45)},
               ("pope",): {"indirect_indexing": (94.82, 2.91)},
               ("rope_half",): {"indirect_indexing": (28.50, 6.10)},
               ("alibi_half",): {"indirect_indexing": (27.35, 10.77)},
               ("learned",): {"indirect_indexing": (10.08, 0.19)},
               ("sinusoidal",): {"indirect_indexing": (1.90, 0.04)}},
    reference_source="PoPE (arXiv 2509.10534) Table 7 v3; last four rows v3 Table 9, unconfirmed",
)
