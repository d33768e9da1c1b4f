"""docs/GRID_REFERENCE.md is the output of ``python -m phaselab.orchestrator.language.reference``: a key
added to the schema, a stage kind or a config dataclass changes the reference, and this test
fails until the committed file is regenerated."""

from __future__ import annotations

from pathlib import Path

from phaselab.orchestrator.language.reference import grid_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "GRID_REFERENCE.md"


def test_the_committed_reference_is_current() -> None:
    text = grid_reference()
    assert DOC.read_text() == text, ("docs/GRID_REFERENCE.md is stale: "
                                     "python -m phaselab.orchestrator.language.reference > docs/GRID_REFERENCE.md")


def test_the_reference_names_every_kind_section_and_key_a_grid_uses() -> None:
    from phaselab.orchestrator.stages import STAGES

    text = grid_reference()
    for key in ("`needs`", "`when`", "`launcher`", "`max_retries`", "`product`", "`zip`", "`exclude`",
                "`train.cuda_graphs`", "`data.num_workers`", "`model.pe.kind`", "`train.eval_splits`",
                "`eval[suite=ppl-by-length].split`", "`resources` | `ResourcesSpec \\| None`"):
        assert key in text, key
    for kind in STAGES:
        assert f"| `{kind}` |" in text, kind
    # every table row keeps its columns: 3 in the key tables, 5 in the stage-kind table (a union's
    # bar inside a cell is escaped)
    bars = {line.count("|") - line.count("\\|") for line in text.splitlines() if line.startswith("| `")}
    assert bars == {4, 6}, bars
