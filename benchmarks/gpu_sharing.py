"""Can launch-bound small steps share one GPU? Aggregate throughput of N copies of one step.

A "step" is a CUDA graph of many small kernels (``--layers`` blocks of a 3072 x 512 matmul, a GELU
and a residual add, forward only: the shape class of the Indirect Indexing model's step, whose
time is set by kernel count, not FLOPs). N copies run side by side for ``--seconds`` as

- ``procs``: N processes, each its own CUDA context (what fractional ``resources.gpus`` gives);
  without MPS the driver time-slices contexts, so kernels of two processes never overlap;
- ``streams``: N CUDA streams in one process, one graph each (kernels may overlap);

and the aggregate replays/s is compared with N = 1. Run it once as is and once with an MPS
control daemon started by the caller (``nvidia-cuda-mps-control -d``) to see what MPS buys.

    python benchmarks/gpu_sharing.py --n 1,2,4,8 --out /tmp/gpu-sharing.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

import torch


def build(layers: int, device: str):
    x = torch.randn(3072, 512, device=device, dtype=torch.bfloat16)
    ws = [torch.randn(512, 512, device=device, dtype=torch.bfloat16) / 23 for _ in range(layers)]

    def step():
        h = x
        for w in ws:
            h = h + torch.nn.functional.gelu(h @ w)
        return h

    return step


def capture(step, stream):
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        step()
    return g


def run_streams(n: int, layers: int, seconds: float) -> float:
    streams = [torch.cuda.Stream() for _ in range(n)]
    graphs = [capture(build(layers, "cuda"), s) for s in streams]
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for g, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                g.replay()
        count += 1
        if count % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return count * n / (time.perf_counter() - t0)


def _proc(layers: int, seconds: float, barrier, out):
    torch.cuda.init()
    s = torch.cuda.Stream()
    g = capture(build(layers, "cuda"), s)
    barrier.wait()
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        g.replay()
        count += 1
        if count % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    out.put(count / (time.perf_counter() - t0))


def run_procs(n: int, layers: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    ps = [ctx.Process(target=_proc, args=(layers, seconds, barrier, out)) for _ in range(n)]
    for p in ps:
        p.start()
    rates = [out.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    return sum(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="1,2,4,8")
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--label", default=os.environ.get("CUDA_MPS_PIPE_DIRECTORY") and "mps" or "no-mps")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    for mode, fn in (("procs", run_procs), ("streams", run_streams)):
        base = None
        for n in [int(v) for v in args.n.split(",")]:
            rate = fn(n, args.layers, args.seconds)
            base = base or rate
            rows.append({"label": args.label, "mode": mode, "n": n, "replays_per_s": round(rate, 1),
                         "vs_one": round(rate / base, 2)})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
