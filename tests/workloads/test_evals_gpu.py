"""GPU: perplexity by length up to 64k tokens with memory linear in length.

A small GPT-2-vocabulary model per encoding (4 layers, width 256, 4 heads of 64; random init —
the point is memory and completion, not the perplexity value) scores one 65 536-token window per
length through ``perplexity_by_length`` in bf16 autocast. Peak memory above the model's own
footprint must grow linearly: doubling the length may at most ~double it (quadratic attention
would quadruple it). Set PHASELAB_GPU_RESULTS=<file.jsonl> to append the measured numbers.
"""

from __future__ import annotations

import itertools
import json
import os
import time

import numpy as np
import pytest
import torch

from phaselab.workloads.evals.options import NiahConfig, PplConfig
from phaselab.workloads.evals.perplexity import perplexity_by_length
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer

LENGTHS = (4096, 8192, 16384, 32768, 65536)


@pytest.mark.gpu
@pytest.mark.parametrize("pe,backend", [("rope", "sdpa"), ("pope", "sdpa"), ("pope", "triton"),
                                        ("tapa", "triton")])
def test_ppl_by_length_to_64k_memory_linear(pe, backend):
    torch.manual_seed(0)
    model = Transformer(preset("owt-124m", n_layer=4, d_model=256, n_head=4, pe={"kind": pe},
                               attention={"backend": backend})).cuda().eval()
    doc = np.random.default_rng(0).integers(0, 50257, LENGTHS[-1] + 1)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    rows = []
    for L in LENGTHS:
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        (r,) = perplexity_by_length(model, [doc], PplConfig(lengths=(L,), max_tokens=L), precision="bf16")
        torch.cuda.synchronize()
        rows.append({"pe": pe, "backend": backend, "context_len": L, "nll": r.nll, "ppl": r.ppl,
                     "n_tokens": r.n_tokens, "peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20,
                     "seconds": time.perf_counter() - t0})
        assert r.n_tokens == L and np.isfinite(r.nll)
    if os.environ.get("PHASELAB_GPU_RESULTS"):
        with open(os.environ["PHASELAB_GPU_RESULTS"], "a") as f:
            f.writelines(json.dumps(x) + "\n" for x in rows)
    print(json.dumps(rows, indent=1))
    for a, b in itertools.pairwise(rows):
        assert b["peak_mib"] <= 2.3 * a["peak_mib"], (a, b)  # linear (x2), not quadratic (x4)
    # random init: close to uniform over the vocabulary at every length
    assert all(abs(x["nll"] - np.log(50257)) < 1.5 for x in rows)


@pytest.mark.gpu
def test_niah_at_64k_completes_with_kv_cache(tmp_path):
    """A 65 536-token NIAH cell decodes through the KV cache on the GPU (random-init char model:
    accuracy is ~0, the point is that the long-context path runs and what it costs)."""
    from phaselab.workloads.data import DataConfig, build_dataset
    from phaselab.workloads.evals import niah

    ds = build_dataset(DataConfig(kind="text"))
    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=ds.vocab_size, block_size=1024, n_layer=4, d_model=256,
                               attention={"backend": "sdpa"})).cuda().eval()
    cfg = NiahConfig(lengths=(65536,), depths=(0.5,), trials=2, batch_size=2, answer="letters")
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    grid = niah.run_grid(niah.model_step(model, max_length=65536, precision="bf16"), ds.tokenizer,
                         ds.tokens("valid"), cfg, digest=ds.digest, cache_dir=tmp_path)
    row = {"suite": "niah", "context_len": 65536, "acc": grid[(65536, 0.5)], "seconds": time.perf_counter() - t0,
           "peak_mib": torch.cuda.max_memory_allocated() / 2**20}
    print(json.dumps(row))
    if os.environ.get("PHASELAB_GPU_RESULTS"):
        with open(os.environ["PHASELAB_GPU_RESULTS"], "a") as f:
            f.write(json.dumps(row) + "\n")
    assert grid[(65536, 0.5)] <= 0.5
