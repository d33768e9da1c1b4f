"""DNA language-model data (the PoPE genome task, EXPERIMENTS §2.2, and its offline stand-in).

Tokenisers (phaselab's id layout; special tokens first so PAD = 0 as in every phaselab dataset):
- "6mer" (Nucleotide Transformer style, vocabulary 4107): 6 specials
  (<pad> <unk> <mask> <cls> <eos> <bos>), the 4096 six-mers in lexicographic ACGT order, then the
  5 single nucleotides A C G T N. The sequence is cut into non-overlapping 6-mers from its start;
  a 6-mer containing N, and the tail shorter than 6, become single-nucleotide tokens.
- "char" (vocabulary 11): the 6 specials, then A C G T N.
Lower-case (soft-masked) bases are upper-cased; any other letter is rejected with ValueError.

Offline data: phage lambda (assets/lambda_virus.fa.gz, 48,502 bp); the last `dna.valid_fraction`
of the nucleotides is held out. A user FASTA (absolute path) works the same way.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from phaselab.workloads.data import (
    ASSETS_DIR,
    DataConfig,
    file_sha256,
    make_digest,
    resolve_path,
    token_dtype,
)
from phaselab.workloads.data.text import StreamDataset

SPECIALS = ("<pad>", "<unk>", "<mask>", "<cls>", "<eos>", "<bos>")
PAD_ID, EOS_ID = 0, 4
BASES = "ACGTN"
K = 6
_CODE = np.full(256, 255, dtype=np.uint8)  # byte -> 0..4 (A C G T N), 255 = invalid
for _i, _b in enumerate(BASES):
    _CODE[ord(_b)] = _CODE[ord(_b.lower())] = _i


class DnaTokenizer:
    """Character ("char") or non-overlapping 6-mer ("6mer") DNA tokenizer; see the module doc."""

    def __init__(self, kind: str = "6mer") -> None:
        if kind not in ("6mer", "char"):
            raise ValueError(f"dna tokenizer must be '6mer' or 'char', got {kind!r}")
        self.name = f"dna-{kind}"
        self.kind = kind
        self.n_kmers = 4**K if kind == "6mer" else 0
        self.single_offset = len(SPECIALS) + self.n_kmers  # id of 'A'
        self.vocab_size = self.single_offset + len(BASES)  # 4107 or 11
        self.eot_token_id = EOS_ID

    def encode_array(self, seq: str | bytes) -> np.ndarray:
        """A nucleotide string -> int64 token ids."""
        raw = np.frombuffer(seq.encode("ascii") if isinstance(seq, str) else seq, dtype=np.uint8)
        codes = _CODE[raw]
        if (codes == 255).any():
            raise ValueError(f"invalid nucleotide {chr(raw[codes == 255][0])!r} (expected A/C/G/T/N)")
        singles = codes.astype(np.int64) + self.single_offset
        if self.kind == "char":
            return singles
        n_full = len(codes) // K
        rows = codes[: n_full * K].reshape(n_full, K).astype(np.int64)
        has_n = (rows == 4).any(axis=1)
        kmer = len(SPECIALS) + (rows * (4 ** np.arange(K - 1, -1, -1))).sum(axis=1)
        out = np.full((n_full, K), -1, dtype=np.int64)
        out[~has_n, 0] = kmer[~has_n]
        out[has_n] = singles[: n_full * K].reshape(n_full, K)[has_n]
        flat = out.reshape(-1)
        return np.concatenate([flat[flat >= 0], singles[n_full * K :]])

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """ids -> nucleotides; specials render as their names, PAD as nothing."""
        parts = []
        for t in np.asarray(ids, dtype=np.int64).tolist():
            if t < len(SPECIALS):
                parts.append("" if t == PAD_ID else SPECIALS[t])
            elif t < self.single_offset:
                c = t - len(SPECIALS)
                parts.append("".join(BASES[(c >> (2 * (K - 1 - j))) & 3] for j in range(K)))
            elif t < self.vocab_size:
                parts.append(BASES[t - self.single_offset])
            else:
                raise ValueError(f"token id {t} out of range for vocabulary {self.vocab_size}")
        return "".join(parts)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "specials": list(SPECIALS), "bases": BASES, "k": K if self.n_kmers else 1}


def iter_fasta(path: Path) -> Iterator[tuple[str, bytes]]:
    """(header, sequence bytes) per record of a FASTA file (.gz read transparently)."""
    opener = gzip.open if path.suffix == ".gz" else open
    header, chunks = None, []
    with opener(path, "rb") as f:
        for line in f:
            line = line.strip()
            if line.startswith(b">"):
                if header is not None:
                    yield header, b"".join(chunks)
                header, chunks = line[1:].decode("utf-8", "replace"), []
            elif line:
                if header is None:
                    raise ValueError(f"{path} is not FASTA: sequence before the first '>' header")
                chunks.append(line)
    if header is None:
        raise ValueError(f"{path} holds no FASTA record")
    yield header, b"".join(chunks)


def split_records(seqs: list[bytes], valid_fraction: float) -> tuple[list[bytes], list[bytes]]:
    """Hold out the last `valid_fraction` of all nucleotides (records kept in order)."""
    total = sum(len(s) for s in seqs)
    cut = total - round(total * valid_fraction)
    train, valid, pos = [], [], 0
    for s in seqs:
        a = min(max(cut - pos, 0), len(s))
        if a:
            train.append(s[:a])
        if a < len(s):
            valid.append(s[a:])
        pos += len(s)
    return train, valid


def encode_records(tok: DnaTokenizer, seqs: list[bytes]) -> np.ndarray:
    """Tokenise each record and join them with <eos>."""
    parts: list[np.ndarray] = []
    for s in seqs:
        if parts:
            parts.append(np.array([EOS_ID], dtype=np.int64))
        parts.append(tok.encode_array(s))
    return np.concatenate(parts).astype(token_dtype(tok.vocab_size))


class DnaDataset(StreamDataset):
    """A FASTA genome as a token stream (train = all but the last valid_fraction, valid = the rest)."""

    @classmethod
    def from_config(cls, cfg: DataConfig) -> DnaDataset:
        dc = cfg.dna
        if not 0.0 < dc.valid_fraction < 1.0:
            raise ValueError(f"dna.valid_fraction must be in (0, 1), got {dc.valid_fraction}")
        tok = DnaTokenizer(dc.tokenizer)
        path = resolve_path(dc.path, root=ASSETS_DIR, what="dna.path")
        if not path.is_file():
            raise ValueError(f"dna.path {path} does not exist")
        train, valid = split_records([s for _, s in iter_fasta(path)], dc.valid_fraction)
        block = cfg.block_size or 1000
        digest = make_digest(file_sha256(path), {"kind": "dna", "tokenizer": tok.config(),
                                                 "valid_fraction": dc.valid_fraction, "block_size": block})
        name = f"dna:{path.name.split('.')[0]}:{dc.tokenizer}"
        return cls(name=name, tokens_by_split={"train": encode_records(tok, train),
                                               "valid": encode_records(tok, valid)},
                   vocab_size=tok.vocab_size, block_size=block, digest=digest, tokenizer=tok)
