"""PoPE, music and genome: best test NLL (nats/token) (EXPERIMENTS §2.2).

One grid per dataset (experiments/pope_jsb.yaml, pope_maestro.yaml, pope_genome.yaml), each with
axes ``pe`` and ``seed``; metric ``nll`` of its ``test_nll`` stage (the ``task`` eval suite) with
``split="test"``, ``step=None`` (the training stage's own final evaluation has a step) and
``task`` = the data kind (``jsb`` | ``maestro`` | ``human_genome``), evaluated on the
best-validation checkpoint (``eval.select: best_valid``): those cells carry the ``†`` mark and the
footnote gives the selected step of every seed (spec.py, "Checkpoint selection").

The "(min over evaluations)" rows: the training stage's ``loss_min_over_evals`` on the test split,
the lowest test NLL over its periodic evaluations (``train.eval_splits: [valid, test]``; pope_jsb
sets it), shown when the catalog has any.
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

SPEC = TableSpec(
    name="pope_music_nll",
    title="Music and genome: test NLL (nats/token) at the best-validation checkpoint",
    grid="pope_jsb",
    extra_grids=("pope_maestro", "pope_genome"),
    rows=(Dim(field="axes.pe", title="PE", values=("rope", "pope"),
              labels={"rope": "RoPE", "pope": "PoPE"}),),
    cols=Dim(field="task", values=("jsb", "maestro", "human_genome"),
             labels={"jsb": "JSB", "maestro": "MAESTRO", "human_genome": "Genome"}),
    metric="nll", where={"split": "test", "step": None}, better="min", decimals=4,
    reference={("rope",): {"jsb": 0.5081, "maestro": 1.501, "human_genome": 4.217},
               ("pope",): {"jsb": 0.4889, "maestro": 1.486, "human_genome": 4.152}},
    reference_source="PoPE (arXiv 2509.10534), single runs",
    also=(("loss_min_over_evals", {"split": "test"}, "min over evaluations"),),
)
