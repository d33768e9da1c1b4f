"""The Gluon TAPA kernels' default tiles against the fastest of their candidates (the target
"untuned defaults within 10 % of autotuned"). The Gluon kernels have no autotuner: their search
space is the tiles below, each of which compiles for sm_90a (triton 3.6.0) without spills or with
a few bytes of them in loop preheaders (benchmarks/gluon_compile_tapa.py and
gluon_compile_tapa_bwd.py print the counts). For each head dim and length it times the forward with
every forward tile, and forward + backward with every dK/dV tile and every dQ tile (the other
kernels at their defaults), all with the default schedules (gluon_tapa_host.DEFAULT_VARIANTS), in
`--repeats` interleaved rounds (cuDNN, then every tile in turn: a drift of the card's speed within
the process reaches every tile alike), and prints each kernel's default against its fastest tile:
`default / best` at most 1.10 meets the target. bf16, causal, H = 16, 65536 tokens a batch, CUDA
events, median of 30 calls after 5 a round (gluon_compile.median_ms).

    benchmarks/run_on_gpu.sh gluon_tapa_tiles --dims 128 64 --lengths 4096 16384 --out gluon-tapa-tiles-h200
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
from pathlib import Path

import gluon_compile
import gluon_compile_bwd
import gluon_compile_tapa
import gluon_compile_tapa_bwd
import torch

from phaselab.kernels.tapa import gluon_tapa_bwd, gluon_tapa_host

# head dim -> kernel -> candidate tiles (BLOCK_M, BLOCK_N, STAGES, warps); the defaults are
# gluon_tapa_host.forward_tile, gluon_tapa_bwd.DKDV_TILES and DQ_TILES (`defaults`)
CANDIDATES = {
    128: {"fwd": [(64, 64, 2, 4), (64, 64, 3, 4), (64, 32, 2, 4), (64, 32, 3, 4), (128, 64, 2, 8)],
          "dkdv": [(32, 128, 2, 8), (16, 128, 2, 8), (32, 128, 3, 8)],
          "dq": [(128, 32, 2, 8), (64, 32, 2, 4), (128, 32, 3, 8)]},
    64: {"fwd": [(64, 64, 2, 4), (64, 64, 3, 4), (64, 32, 2, 4), (128, 64, 2, 8)],
         "dkdv": [(32, 128, 2, 8), (16, 128, 2, 8), (32, 128, 3, 8)],
         "dq": [(128, 64, 2, 8), (128, 32, 2, 8), (64, 64, 2, 4), (128, 64, 3, 8)]},
}
KERNELS = ("fwd", "dkdv", "dq")


def defaults(D: int) -> dict[str, tuple]:
    """The tile each kernel takes unless told, per kernel."""
    fwd = gluon_tapa_host.forward_tile(D, gluon_tapa_host.variant_flags(None, D))
    return {"fwd": fwd, "dkdv": gluon_tapa_bwd.DKDV_TILES[D], "dq": gluon_tapa_bwd.DQ_TILES[D]}


def tile_name(tile: tuple) -> str:
    return "x".join(map(str, tile))


def timers(D: int, kernel: str):
    """(time_row(tile, N), time_ref(N)) of one kernel's rows: the forward against cuDNN's forward,
    a backward kernel's tiles as forward + backward against cuDNN's."""
    variants = gluon_tapa_host.DEFAULT_VARIANTS[D]
    if kernel == "fwd":
        return (lambda tile, N: gluon_compile_tapa.time_tapa(D, N, tile, True, "quadratic", variants),
                lambda N: gluon_compile.time_forward(D, N, None, True))
    return (lambda tile, N: gluon_compile_tapa_bwd.time_fwd_bwd(D, N, variants, **{f"{kernel}_tile": tile}),
            lambda N: gluon_compile_bwd.time_fwd_bwd(D, N, None))


def guarded(time_row):
    """time_row(tile, N), or inf (never the fastest) where that tile fails to compile or launch,
    with the reason printed: one candidate's failure leaves the others their rows."""
    def run(tile: tuple, N: int) -> float:
        try:
            return time_row(tile, N)
        except Exception as exc:  # noqa: BLE001 - a compile error, shared memory beyond the card's, ...
            print(f"  {tile_name(tile)} at N={N} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                  flush=True)
            return math.inf
    return run


def summarise(D: int, kernel: str, tiles: list[tuple], default: tuple, timings: dict[int, dict]) -> list[dict]:
    """One row per length and tile of `gluon_compile_tapa.interleaved`'s timings: the median ms
    of its rounds and their range, the median of its per-round ratios to cuDNN and to the
    default tile, and whether it is the default or the fastest."""
    rows = []
    for N, t in timings.items():
        ms = [statistics.median(r) for r in t["rows"]]
        i_def = tiles.index(default)
        best = min(range(len(tiles)), key=ms.__getitem__)
        for i, tile in enumerate(tiles):
            rounds = t["rows"][i]
            rows.append({"D": D, "N": N, "kernel": kernel, "tile": tile_name(tile), "ms": ms[i],
                         "ms_min": min(rounds), "ms_max": max(rounds),
                         "x_cudnn": statistics.median(m / r for m, r in zip(rounds, t["ref"])),
                         "x_default": statistics.median(m / d for m, d in zip(rounds, t["rows"][i_def])),
                         "default": i == i_def, "best": i == best})
    return rows


def verdicts(rows: list[dict], limit: float = 1.10) -> list[dict]:
    """Per (D, N, kernel): the default's ms over the fastest tile's (1.0 where the default is the
    fastest) and whether that is within `limit`."""
    out = []
    for key in dict.fromkeys((r["D"], r["N"], r["kernel"]) for r in rows):
        group = [r for r in rows if (r["D"], r["N"], r["kernel"]) == key]
        default = next(r for r in group if r["default"])
        best = next(r for r in group if r["best"])
        ratio = default["ms"] / best["ms"]
        out.append({"D": key[0], "N": key[1], "kernel": key[2], "default": default["tile"], "best": best["tile"],
                    "default_ms": default["ms"], "best_ms": best["ms"], "default_over_best": ratio,
                    "within": ratio <= limit})
    return out


def tables(rows: list[dict], summary: list[dict] | None = None) -> str:
    """The markdown of every tile's row, then (summary given) each kernel's verdict."""
    lines = ["| D | N | kernel | tile | ms | range | x cuDNN | x default |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = " (default)" if r["default"] else ""
        lines.append(f"| {r['D']} | {r['N']} | {r['kernel']} | {r['tile']}{mark} | {r['ms']:.3f} | "
                     f"{r['ms_min']:.3f}-{r['ms_max']:.3f} | {r['x_cudnn']:.2f} | {r['x_default']:.3f} |")
    if not summary:
        return "\n".join(lines) + "\n"
    lines += ["", "| D | N | kernel | default | fastest | default / fastest | within 10 % |",
              "|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['D']} | {s['N']} | {s['kernel']} | {s['default']} | {s['best']} | "
                     f"{s['default_over_best']:.3f} | {'yes' if s['within'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=[128, 64], choices=sorted(CANDIDATES))
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--repeats", type=int, default=3, metavar="R", help="interleaved rounds (default 3)")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    gluon_compile.require_gluon("gluon_tapa_tiles.py", gluon_tapa_host.gluon_common.IMPORT_ERROR)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gluon_tapa_tiles.py needs an sm_90 GPU")
    meta = {"card": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "torch": torch.__version__, "triton": __import__("triton").__version__,
        "command": "python benchmarks/gluon_tapa_tiles.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": os.environ.get("PHASELAB_GIT_COMMIT", "unknown"),
        "timing": f"CUDA events, median of 30 a round, {args.repeats} interleaved rounds"}
    rows = []
    for D in args.dims:
        for kernel in args.kernels:
            tiles, default = CANDIDATES[D][kernel], defaults(D)[kernel]
            time_row, time_ref = timers(D, kernel)
            time_row = guarded(time_row)
            timings = gluon_compile_tapa.interleaved(args.lengths, len(tiles), args.repeats,
                                                     lambda i, N, tiles=tiles, f=time_row: f(tiles[i], N), time_ref)
            rows += summarise(D, kernel, tiles, default, timings)
            print(tables([r for r in rows if r["D"] == D and r["kernel"] == kernel]), flush=True)
            save(args.out, meta, rows)   # after every kernel: a run cut short keeps what it measured
    print(tables(rows, verdicts(rows)))


def save(out: str | None, meta: dict, rows: list[dict]) -> None:
    """OUT.json (meta, rows, summary) and OUT.md (meta, then `tables`) of the rows so far."""
    if not out:
        return
    summary = verdicts(rows)
    Path(out + ".json").write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=1))
    head = "\n".join(f"- {k}: {v}" for k, v in meta.items())
    Path(out + ".md").write_text(f"# Gluon TAPA tiles: defaults against the fastest\n\n{head}\n\n{tables(rows, summary)}")


if __name__ == "__main__":
    main()
