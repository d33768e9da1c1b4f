"""Length extrapolation at small scale (experiments/extrapolation_small.yaml): char-level Tiny
Shakespeare perplexity by evaluation length, models trained at 256 tokens.

Grid ``extrapolation_small``; axes ``pe`` and ``seed``; rows are (``pe``, stage role):
``ppl`` the pretrained model as is, ``ppl_yarn_inference`` the RoPE model with YaRN x16 at
inference only, ``ppl_yarn_ft`` / ``ppl_pi_ft`` the RoPE fine-tunes at 1024 (factor 4); metric
``ppl`` (``ppl-by-length`` suite, validation split) with ``context_len`` 256 ... 4096 (1x-16x).
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

TRAIN_LEN = 256
LENGTHS = (256, 512, 1024, 2048, 4096)

SPEC = TableSpec(
    name="extrapolation_small_ppl",
    title=f"Length extrapolation (char Tiny Shakespeare, trained at {TRAIN_LEN})",
    grid="extrapolation_small",
    rows=(Dim(field="axes.pe", title="PE", values=("rope", "pope", "tapa"),
              labels={"rope": "RoPE", "pope": "PoPE", "tapa": "TAPA"}),
          Dim(field="role", title="Model",
              values=("ppl", "ppl_yarn_inference", "ppl_yarn_ft", "ppl_pi_ft"),
              labels={"ppl": "pretrained", "ppl_yarn_inference": "+ YaRN x16 at inference",
                      "ppl_yarn_ft": "+ YaRN ft@1024", "ppl_pi_ft": "+ PI ft@1024"})),
    row_keys=(("rope", "ppl"), ("rope", "ppl_yarn_inference"), ("rope", "ppl_yarn_ft"),
              ("rope", "ppl_pi_ft"), ("pope", "ppl"), ("tapa", "ppl")),
    cols=Dim(field="context_len", title="evaluation length (tokens)", values=LENGTHS),
    metric="ppl", better="min", decimals=2, seeds=(0,),
    caption=("Validation perplexity (non-overlapping windows, 32k scored tokens per length). "
             "Columns are 1x, 2x, 4x, 8x and 16x the training length; fine-tunes ran 300 steps at 1024."),
)
