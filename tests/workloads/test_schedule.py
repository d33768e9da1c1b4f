"""Schedule values at every boundary (warm-up, cosine, floor; constant fine-tune variant)."""

import itertools
import math

import pytest

from phaselab.workloads.train.schedule import Schedule


def test_cosine_boundaries():
    s = Schedule(lr=1e-3, min_lr=1e-4, warmup=10, decay_steps=110)
    assert s.lookup(0) == pytest.approx(1e-4)            # (0+1)/10 of peak, never 0
    assert s.lookup(4) == pytest.approx(5e-4)
    assert s.lookup(9) == pytest.approx(1e-3)            # last warm-up step reaches the peak
    assert s.lookup(10) == pytest.approx(1e-3)           # cosine starts at the peak
    assert s.lookup(60) == pytest.approx(5.5e-4)         # half-way: (lr + min_lr) / 2
    assert s.lookup(35) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi / 4)) * 9e-4)
    assert s.lookup(110) == pytest.approx(1e-4)          # reaches min_lr at decay_steps
    assert s.lookup(10_000) == pytest.approx(1e-4)       # and stays there
    values = [s.lookup(i) for i in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))  # monotone decay


def test_constant_after_warmup_finetune():
    # EXPERIMENTS §2.4: 500 steps, 20 warm-up, 6e-5 constant (no decay)
    s = Schedule(lr=6e-5, min_lr=0.0, warmup=20, kind="constant")
    assert s.lookup(0) == pytest.approx(3e-6)
    assert s.lookup(19) == pytest.approx(6e-5)
    assert s.lookup(20) == s.lookup(499) == s.lookup(10_000) == pytest.approx(6e-5)


def test_no_warmup_and_validation():
    assert Schedule(lr=1.0, min_lr=0.5, warmup=0, decay_steps=2).lookup(0) == 1.0
    with pytest.raises(ValueError, match="min_lr"):
        Schedule(lr=1e-3, min_lr=1e-2, decay_steps=5)
    with pytest.raises(ValueError, match="decay_steps"):
        Schedule(lr=1e-3, warmup=10, decay_steps=5)
    with pytest.raises(ValueError, match="kind"):
        Schedule(lr=1e-3, kind="linear")
    with pytest.raises(ValueError, match="step"):
        Schedule(lr=1e-3).lookup(-1)
