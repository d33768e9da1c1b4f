"""DNA tokenisers (6-mer vocabulary 4107, char 11) and the shipped phage-lambda dataset."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from phaselab.workloads.data import DataConfig, DnaConfig, build_dataset
from phaselab.workloads.data.dna import DnaTokenizer, encode_records, iter_fasta, split_records

LAMBDA_START = "GGGCGGCGACCTCGCGGGTTTTCGCTATTTATGAAAATTTTCCGGTTTAAGGCGTTTCCGTTCTTCTTCG"


def test_vocab_sizes_and_fixed_ids():
    six, ch = DnaTokenizer("6mer"), DnaTokenizer("char")
    assert (six.vocab_size, ch.vocab_size) == (4107, 11)
    # 6 specials, then 4^6 k-mers (A=0 C=1 G=2 T=3, base-4 big-endian), then A C G T N
    assert six.encode("AAAAAA") == [6] and six.encode("TTTTTT") == [4101]
    assert six.encode("ACGTAC") == [6 + 256 + 2 * 64 + 3 * 16 + 1]
    assert six.encode("ACGTNAACGTAC") == [4102, 4103, 4104, 4105, 4106, 4102, 439]  # 6-mer with N -> singles
    assert six.encode("ACGTACGT") == [439, 4104, 4105]  # tail shorter than 6 -> singles
    assert ch.encode("acgtn") == [6, 7, 8, 9, 10]  # soft-masked lower case is upper-cased
    with pytest.raises(ValueError, match="'R'"):
        six.encode("ACGRT")


def test_round_trip_random_sequences():
    rng = np.random.default_rng(0)
    for kind in ("6mer", "char"):
        tok = DnaTokenizer(kind)
        for n in (0, 1, 5, 6, 7, 61, 600):
            seq = "".join(rng.choice(list("ACGTN"), size=n, p=[0.24, 0.24, 0.24, 0.24, 0.04]))
            assert tok.decode(tok.encode(seq)) == seq
    six = DnaTokenizer("6mer")
    assert six.decode(range(6, 4102)).count("A") == 6 * 4096 // 4  # all 4096 k-mers decode distinctly
    assert len({six.decode([i]) for i in range(6, 4102)}) == 4096


def test_lambda_dataset():
    ds = build_dataset(DataConfig(kind="dna"))
    assert (ds.vocab_size, ds.block_size, ds.tokenizer.eot_token_id) == (4107, 1000, 4)
    train, valid = ds.tokens("train"), ds.tokens("valid")
    # 48,502 bp: 43,652 train (7,275 six-mers + 2 singles), 4,850 valid (808 + 2)
    assert (len(train), len(valid)) == (7277, 810)
    assert ds.tokenizer.decode(train[:12]).startswith(LAMBDA_START)  # first FASTA line
    assert len(ds.tokenizer.decode(train)) + len(ds.tokenizer.decode(valid)) == 48_502
    evals = list(ds.eval_batches("valid", 4))
    assert len(evals) == 1 and evals[0].n_scored == 809
    b = ds.get_batch("train", 2, 3, seed=0)
    assert torch.equal(b.x_BT, build_dataset(DataConfig(kind="dna")).get_batch("train", 2, 3, seed=0).x_BT)
    chars = build_dataset(DataConfig(kind="dna", block_size=256, dna=DnaConfig(tokenizer="char")))
    assert chars.vocab_size == 11 and len(chars.tokens("train")) == 43_652
    assert chars.digest != ds.digest


def test_multi_record_fasta(tmp_path):
    fa = tmp_path / "two.fa.gz"
    with gzip.open(fa, "wt") as f:
        f.write(">chrA test\nACGTAC\nGTAC\n>chrB\nNNNNAAAAAA\n")
    recs = list(iter_fasta(fa))
    assert recs == [("chrA test", b"ACGTACGTAC"), ("chrB", b"NNNNAAAAAA")]
    train, valid = split_records([s for _, s in recs], 0.25)  # 20 bp -> last 5 held out
    assert (train, valid) == ([b"ACGTACGTAC", b"NNNNA"], [b"AAAAA"])
    tok = DnaTokenizer("6mer")
    ids = encode_records(tok, train)
    assert tok.decode(ids) == "ACGTACGTAC<eos>NNNNA"
    ds = build_dataset(DataConfig(kind="dna", block_size=4, dna=DnaConfig(path=str(fa), valid_fraction=0.25)))
    assert ds.tokens("valid").tolist() == [4102] * 5
    bad = tmp_path / "bad.fa"
    bad.write_text("ACGT\n")
    with pytest.raises(ValueError, match="not FASTA"):
        list(iter_fasta(bad))
