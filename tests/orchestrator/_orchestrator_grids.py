"""Small grid texts shared by the orchestrator tests (tiny model, Tiny Shakespeare)."""

BASE = """\
grid: t
seeds: [0]
axes:
  product:
    pe: [rope, pope]
defaults:
  model: {preset: tiny, block_size: 32, pe: {kind: "${pe}"}}
  data: {kind: text, block_size: 32}
  train: {steps: 2, batch_size: 2, eval_every: 0, device: cpu}
  launcher: ray_task
stages:
  pretrain:
    kind: pretrain
  ppl:
    kind: eval
    needs: [pretrain]
    eval: {suite: ppl-by-length, ppl: {lengths: [32]}, device: cpu}
"""


def locate(text: str, needle: str, nth: int = 1) -> tuple[int, int]:
    """1-based (line, column) of the ``nth`` line containing ``needle``."""
    for i, line in enumerate(text.splitlines(), start=1):
        col = line.find(needle)
        if col >= 0:
            nth -= 1
            if nth == 0:
                return i, col + 1
    raise AssertionError(f"{needle!r} not in the text")
