"""TAPA Tables 1-3 in miniature (experiments/tapa_long_context_small.yaml): char-level Jane Austen
perplexity by context length of models pretrained at 512, zero-shot and after continued
pretraining at 2048 (EXPERIMENTS §3.3, scaled).

Grid ``tapa_long_context_small``; axes ``pe``, ``phase`` (TAPA's phase function), ``lr``,
``min_lr``, ``qk_norm`` and ``seed``. Rows are (``qk_norm``, ``pe``, ``phase``, stage role): the
zero-shot evals ``ppl_zero_shot`` (every pretrained model) and ``ppl_zero_shot_pi`` /
``ppl_zero_shot_yarn`` (RoPE with PI / YaRN x8 at inference only) as in Table 2; the evals after
continued pretraining ``ppl_rope_b5e5`` | ``ppl_rope_b2e8`` | ``ppl_pi`` | ``ppl_yarn`` (RoPE's
four variants), ``ppl_tapa`` (quadratic and linear phase: Tables 1 and 3) and ``ppl_pope``.
Metric ``ppl`` (sliding window, stride 256) on the validation split at ``context_len`` 512 ...
8192 (1x ... 16x). The grid's default (no qk-norm) only; the qk-norm recipe of its comment is a
pivot: ``phaselab tables tapa_long_context_small --metric ppl --rows pe,phase,role --cols
context_len --where qk_norm=true``. The paper's numbers (7B, PG-19) are not comparable in scale
and are not shown.
"""

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

TRAIN_LEN = 512
LENGTHS = (512, 1024, 2048, 3072, 4096, 8192)
ROLES = {
    "ppl_zero_shot": "zero-shot", "ppl_zero_shot_yarn": "YaRN x8 at inference", "ppl_zero_shot_pi": "PI x8 at inference",
    "ppl_rope_b5e5": "cpt@2048, b=5e5", "ppl_rope_b2e8": "cpt@2048, b=2e8", "ppl_pi": "cpt@2048, PI x8",
    "ppl_yarn": "cpt@2048, YaRN x8", "ppl_tapa": "cpt@2048", "ppl_pope": "cpt@2048",
}
# (pe, phase, role) in display order: Table 2's rows, then Tables 1 and 3's
MODELS = (
    ("rope", "quadratic", "ppl_zero_shot"), ("rope", "quadratic", "ppl_zero_shot_yarn"),
    ("rope", "quadratic", "ppl_zero_shot_pi"), ("tapa", "quadratic", "ppl_zero_shot"),
    ("tapa", "linear", "ppl_zero_shot"), ("pope", "quadratic", "ppl_zero_shot"),
    ("rope", "quadratic", "ppl_rope_b5e5"), ("rope", "quadratic", "ppl_rope_b2e8"), ("rope", "quadratic", "ppl_pi"),
    ("rope", "quadratic", "ppl_yarn"), ("tapa", "quadratic", "ppl_tapa"), ("tapa", "linear", "ppl_tapa"),
    ("pope", "quadratic", "ppl_pope"),
)
# The shipped grid's data as the title names it (catalog/reports/tables/dataset.py).
DATASET = "Jane Austen"

SPEC = TableSpec(
    name="tapa_long_context_small",
    title=f"TAPA long context in miniature: Jane Austen (char level) perplexity, trained at {TRAIN_LEN}",
    grid="tapa_long_context_small",
    rows=(Dim(field="axes.qk_norm", title="qk-norm", values=(False,), labels={False: "no"}),
          Dim(field="axes.pe", title="PE", values=("rope", "tapa", "pope"),
              labels={"rope": "RoPE", "tapa": "TAPA", "pope": "PoPE"}),
          Dim(field="axes.phase", title="phase", values=("quadratic", "linear")),
          Dim(field="role", title="Model", values=tuple(ROLES), labels=ROLES)),
    row_keys=tuple((False, *key) for key in MODELS),
    cols=Dim(field="context_len", title="evaluation length (characters)", values=LENGTHS),
    metric="ppl", where={"split": "valid"}, better="min", decimals=2, seeds=(0, 1),
    caption=("Validation perplexity (the last 10 % of the novels), sliding windows with stride 256, 32k scored "
             "characters per length; columns are 1x ... 16x the pretraining length. The first six rows are the "
             "pretrained models (Table 2), the others after 200 steps of continued pretraining at 2048 "
             "(Tables 1 and 3)."),
)
