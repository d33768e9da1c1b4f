"""PoPE, music and genome: best test NLL (nats/token) (EXPERIMENTS §2.2).

One grid per dataset (``pope_jsb`` = experiments/pope_jsb.yaml, ``pope_maestro``,
``pope_genome``), each with axes ``pe`` and ``seed``; metric ``nll`` from the ``task`` eval suite
with ``split="test"``, ``step=None`` and ``task`` = the data kind (``jsb`` | ``maestro`` |
``dna``), evaluated on the best-validation checkpoint (``eval.select: best_valid``).
"""

from phaselab.catalog.tables.spec import Dim, TableSpec

SPEC = TableSpec(
    name="pope_music_nll",
    title="Music and genome: test NLL (nats/token) at the best-validation checkpoint",
    grid="pope_jsb",
    extra_grids=("pope_maestro", "pope_genome"),
    rows=(Dim(field="axes.pe", title="PE", values=("rope", "pope"),
              labels={"rope": "RoPE", "pope": "PoPE"}),),
    cols=Dim(field="task", values=("jsb", "maestro", "dna"),
             labels={"jsb": "JSB", "maestro": "MAESTRO", "dna": "Genome"}),
    metric="nll", where={"split": "test", "step": None}, better="min", decimals=4,
    reference={("rope",): {"jsb": 0.5081, "maestro": 1.501, "dna": 4.217},
               ("pope",): {"jsb": 0.4889, "maestro": 1.486, "dna": 4.152}},
    reference_source="PoPE (arXiv 2509.10534), single runs",
)
