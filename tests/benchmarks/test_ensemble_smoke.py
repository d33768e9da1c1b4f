"""benchmarks/ensemble.py on the CPU: the stacked ensemble trains every member exactly as that
member trained alone (fp32), the check notices members that leak into each other, and one
``--tiny`` run writes the JSON and Markdown rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ensemble

STEPS = 4


def _train_ensemble(K: int) -> tuple[ensemble.EnsembleStep, list[tuple], list[torch.nn.Module]]:
    device = torch.device("cpu")
    members = ensemble.build_members("rope:sdpa", range(K), steps=20, tiny=True, device=device)
    singles = [ensemble.copy.deepcopy(m) for m, _, _ in members]   # before any step
    ens = ensemble.EnsembleStep([m for m, _, _ in members], members[0][2],
                                ensemble.device_batches(members, device), device=device)
    for _ in range(STEPS):
        ens.advance()
    return ens, members, singles


def test_members_train_exactly_as_alone():
    ens, members, singles = _train_ensemble(3)
    check = ensemble.parity(ens, members, singles, STEPS)
    assert check["param_rel_diff"] < 1e-6 and check["update_rel_diff"] < 1e-5 and check["loss_rel_diff"] < 1e-6
    # the check is meaningful: clipping acted, on norms that differ by member
    norms = check["grad_norms_first_step"]
    assert min(norms) > check["grad_clip"] and max(norms) - min(norms) > 1e-3
    # own seeds: different initial weights and different batches per member
    assert not torch.equal(members[0][0].wte.weight, members[1][0].wte.weight)
    assert not torch.equal(ens.x[:, 0], ens.x[:, 1])


def test_parity_fails_when_clipping_mixes_members(monkeypatch: pytest.MonkeyPatch):
    def clip_global(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
        # the bug to catch: one norm over all K members, as clip_grad_norm_ on the stack would do
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm.expand(grads[0].shape[0])

    monkeypatch.setattr(ensemble, "clip_per_member", clip_global)
    ens, members, singles = _train_ensemble(2)
    check = ensemble.parity(ens, members, singles, STEPS)
    assert check["update_rel_diff"] > 1e-2


def test_tiny_cpu_run_writes_json_and_markdown(tmp_path: Path, monkeypatch):
    # Triton on CPU without the interpreter: the backend refuses the row (tests/kernels' conftest
    # turns the interpreter on for the whole session; the vmap rule itself is tested there)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = tmp_path / "ens"
    code = ensemble.main(["--device", "cpu", "--tiny", "--ks", "1,2", "--encodings", "rope:sdpa,pope:triton",
                          "--steps", "3", "--check-steps", "3", "--baseline-steps", "12", "--out", str(out)])
    assert code == 0
    result = json.loads(out.with_suffix(".json").read_text())
    meta, rows, (base,) = result["meta"], result["rows"], result["baselines"]
    assert meta["command"].startswith("python benchmarks/ensemble.py --device cpu --tiny")
    assert base["pe"] == "rope" and base["mode"] == "graphs" and base["steps_per_s"] > 0
    ok = [r for r in rows if not r["error"]]
    assert [(r["encoding"], r["K"]) for r in ok] == [("rope:sdpa", 1), ("rope:sdpa", 2)]
    for r in ok:
        assert r["parity"]["param_rel_diff"] < 1e-6 and r["parity"]["steps"] == 3
        assert r["member_steps_per_s"] == pytest.approx(r["K"] * r["steps_per_s"])
        assert r["x_k1"] is not None and r["x_platform"] is not None and not r["captured"]
    (skipped,) = [r for r in rows if r["error"]]   # recorded, not raised; the encoding's other Ks not tried
    assert skipped["encoding"] == "pope:triton" and skipped["K"] == 1
    assert skipped["error"].startswith("BackendUnsupported: ") and "need CUDA" in skipped["error"]
    md = out.with_suffix(".md").read_text()
    assert "| rope:sdpa | graphs | 2 |" in md and "skipped:" in md and meta["command"] in md
