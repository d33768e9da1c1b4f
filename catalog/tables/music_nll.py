"""PoPE, music and genome: best test NLL (nats/token) (EXPERIMENTS §2.2).

Grid ``pope-music``; axes ``pe``, ``dataset`` (``jsb`` | ``maestro`` | ``genome``) and ``seed``;
metric ``nll`` with ``split="test"`` and ``step=None`` (the value at the best-validation
checkpoint, ``eval.select: best_valid``; the minimum over evaluations is stored under another name).
"""

from phaselab.catalog.tables.spec import Dim, TableSpec

SPEC = TableSpec(
    name="pope_music_nll",
    title="Music and genome: test NLL (nats/token) at the best-validation checkpoint",
    grid="pope-music",
    rows=(Dim(field="axes.pe", title="PE", values=("rope", "pope"), labels={"rope": "RoPE", "pope": "PoPE"}),),
    cols=Dim(field="axes.dataset", values=("jsb", "maestro", "genome"),
             labels={"jsb": "JSB", "maestro": "MAESTRO", "genome": "Genome"}),
    metric="nll", where={"split": "test", "step": None}, better="min", decimals=4,
    reference={("rope",): {"jsb": 0.5081, "maestro": 1.501, "genome": 4.217},
               ("pope",): {"jsb": 0.4889, "maestro": 1.486, "genome": 4.152}},
    reference_source="PoPE (arXiv 2509.10534), single runs",
)
