"""PoPE, length extrapolation on PG-19: test perplexity by evaluation length 1024..10240
(EXPERIMENTS §2.4). The paper shows this as Figure 2 only, so there is no reference column.

Grid ``pope_owt_extrapolation`` (experiments/pope_owt_extrapolation.yaml); axes ``size`` (``124m``
| ``253m`` | ``774m``), ``pe`` and ``seed``; rows are (size, ``pe``, stage role): ``ppl_zero_shot``
evaluates the 1024-token pretrained model, ``ppl_yarn`` the RoPE + YaRN fine-tune at 4096,
``ppl_pope_ft`` the PoPE+ft fine-tune at 4096 (no interpolation); metric ``ppl`` with
``task="pg19"``, ``split="test"`` and ``context_len`` = the evaluation length. One seed, as the grid
runs.
"""

from phaselab.catalog.reports.tables.owt_ppl import SIZE_LABELS
from phaselab.catalog.reports.tables.spec import Dim, TableSpec

SIZES = ("124m", "253m", "774m")
# (pe, role): the four curves of Figure 2; the fine-tune evals exist only for their own encoding
CURVES = (("rope", "ppl_zero_shot"), ("rope", "ppl_yarn"), ("pope", "ppl_zero_shot"), ("pope", "ppl_pope_ft"))

SPEC = TableSpec(
    name="pope_pg19_extrapolation",
    title="PG-19 test perplexity by evaluation length (trained at 1024)",
    grid="pope_owt_extrapolation",
    rows=(Dim(field="axes.size", title="Size", values=SIZES, labels=SIZE_LABELS),
          Dim(field="axes.pe", title="PE", values=("rope", "pope"), labels={"rope": "RoPE", "pope": "PoPE"}),
          Dim(field="role", title="Model", values=("ppl_zero_shot", "ppl_yarn", "ppl_pope_ft"),
              labels={"ppl_zero_shot": "zero-shot", "ppl_yarn": "+ YaRN ft@4096",
                      "ppl_pope_ft": "+ ft@4096"})),
    row_keys=tuple((size, *curve) for size in SIZES for curve in CURVES),
    cols=Dim(field="context_len", values=tuple(1024 * k for k in range(1, 11))),
    metric="ppl", where={"task": "pg19", "split": "test"}, better="min", decimals=2, seeds=(0,),
    bold_group="axes.size",
)
