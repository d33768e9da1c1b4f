"""lm-evaluation-harness adapter: our model + tokenizer as an ``lm_eval`` LM (DESIGN §3.5, §5.8).

The adapter is passed to ``lm_eval.simple_evaluate`` **as an instance** (no registry string, no
hub access)::

    lm = PhaseLabLM(model, tokenizer, max_length=1024, batch_size=8, device="cuda")
    results = simple_evaluate(model=lm, tasks=["blimp_local"], num_fewshot=0,
                              task_manager=TaskManager(include_path=str(bundle_dir)),
                              log_samples=True)

Three methods carry the semantics (lm_eval ``api/model.py``):

- ``_loglikelihood_tokens``: for (context, continuation) token lists, the sum of
  log p(continuation token | everything before it) and whether every continuation token is the
  argmax. The input is ``(context + continuation)[-(max_length + 1):][:-1]`` (left truncation to
  ``max_length``, EXPERIMENTS §2.5): logits at input position i predict token i + 1, so the
  continuation's log-probs are read from the last ``len(continuation)`` logit rows. Worked
  example: context [5, 6], continuation [7, 8] → input [5, 6, 7]; rows 1 and 2 score 7 and 8.
- ``loglikelihood_rolling``: the document's total log-likelihood from disjoint rolling windows of
  ``max_length`` (lm_eval's ``get_rolling_token_windows``; the first token is conditioned on
  ``prefix_token_id``, the EOT by default).
- ``generate_until``: greedy decoding (``niah.greedy_decode``) until a stop string, EOT or
  ``max_gen_toks``; the prompt is left-truncated so prompt + generation fit ``max_length``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from phaselab.workloads.evals.niah import greedy_decode
from phaselab.workloads.evals.perplexity import autocast, model_device, token_logprobs

TokenPair = tuple[list[int], list[int]]


@torch.no_grad()
def continuation_logprobs(model: torch.nn.Module, pairs: Sequence[TokenPair], *, max_length: int,
                          precision: str = "auto") -> list[tuple[float, bool]]:
    """(sum log p(continuation), is_greedy) for each (context, continuation) pair, one batch.

    Sequences are right-padded with their own last token to the batch's longest input: the model
    is causal, so padding after a sequence never changes the rows read for it.
    """
    device = model_device(model)
    inputs, conts = [], []
    for ctx, cont in pairs:
        if not cont:
            raise ValueError("continuation must have at least one token")
        if len(cont) > max_length:
            raise ValueError(f"continuation of {len(cont)} tokens exceeds max_length={max_length}")
        inputs.append((list(ctx) + list(cont))[-(max_length + 1):][:-1])
        conts.append(list(cont))
    width = max(len(x) for x in inputs)
    x_BT = torch.tensor([x + [x[-1]] * (width - len(x)) for x in inputs], dtype=torch.long, device=device)
    with autocast(device, precision):
        logits_BTV, _ = model(x_BT)
    out = []
    for b, (inp, cont) in enumerate(zip(inputs, conts)):
        rows_CV = logits_BTV[b, len(inp) - len(cont):len(inp)]
        cont_C = torch.tensor(cont, dtype=torch.long, device=device)
        lp = token_logprobs(rows_CV[None], cont_C[None])[0]
        greedy = bool((rows_CV.argmax(-1) == cont_C).all())
        out.append((float(lp.double().sum()), greedy))
    return out


class PhaseLabLM(TemplateLM):
    """A phaselab ``Transformer`` (``forward(idx_BT) -> (logits_BTV, loss)``) for lm_eval.

    Args:
        model: the causal LM (moved nowhere; its parameters' device is used).
        tokenizer: encode(str) -> list[int], decode(list[int]) -> str, eot_token_id.
        max_length: evaluation context (from the eval stage, not the training length).
        batch_size: requests per forward pass (loglikelihood) — generation runs one at a time.
        precision: "auto" | "fp32" | "bf16" (perplexity.autocast).
        max_gen_toks: default generation budget when a task gives none.
        prefix_token_id: the token that conditions an empty context (lm_eval's prefix, e.g. for
            BLiMP, whose context is ""). Default: the tokenizer's EOT. Tokenizers without EOT
            (character level) must name one explicitly, e.g. the id of "\n" — never guessed.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, max_length: int, batch_size: int = 1,
                 device: str | None = None, precision: str = "auto", max_gen_toks: int = 256,
                 prefix_token_id: int | None = None) -> None:
        super().__init__()
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        for attr in ("encode", "decode", "eot_token_id"):
            if not hasattr(tokenizer, attr):
                raise TypeError(f"tokenizer {type(tokenizer).__name__} lacks {attr!r}")
        self.model = model.eval() if device is None else model.to(device).eval()
        self._tokenizer = tokenizer
        self.max_length = int(max_length)
        self.batch_size = int(batch_size)
        self.precision = precision
        self.max_gen_toks = int(max_gen_toks)
        self._eot = tokenizer.eot_token_id
        self._prefix = self._eot if prefix_token_id is None else int(prefix_token_id)
        if self._prefix is None:
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name', type(tokenizer).__name__)!r} has no EOT "
                             "token; pass prefix_token_id (e.g. the id of '\\n' for a char-level model)")

    @property
    def eot_token_id(self) -> int:
        """The tokenizer's EOT, or the explicit prefix token when the tokenizer has none."""
        return int(self._prefix if self._eot is None else self._eot)

    @property
    def prefix_token_id(self) -> int:
        return int(self._prefix)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kw: Any) -> list[int]:
        return list(self._tokenizer.encode(string))

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self._tokenizer.decode(list(tokens))

    def _score_pairs(self, pairs: list[TokenPair]) -> list[tuple[float, bool]]:
        """Batches of ``batch_size``, longest first (less padding), answers in input order."""
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
        answers: list[tuple[float, bool] | None] = [None] * len(pairs)
        for i in range(0, len(order), self.batch_size):
            idx = order[i:i + self.batch_size]
            for j, ans in zip(idx, continuation_logprobs(self.model, [pairs[j] for j in idx],
                                                         max_length=self.max_length,
                                                         precision=self.precision)):
                answers[j] = ans
        return answers  # type: ignore[return-value]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kw: Any) -> list[tuple[float, bool]]:
        answers = self._score_pairs([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), ans in zip(requests, answers):
            if key is not None and key[0] is not None:
                self.cache_hook.add_partial("loglikelihood", key, ans)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in [req.args for req in requests]:
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(lp for lp, _ in self._score_pairs(windows)) if windows else 0.0
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen_kwargs in [req.args for req in requests]:
            kw = dict(gen_kwargs or {})
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.pop("max_gen_toks", self.max_gen_toks))
            if kw.get("do_sample") or float(kw.get("temperature", 0.0) or 0.0) > 0.0:
                raise ValueError(f"PhaseLabLM decodes greedily only; got gen_kwargs {gen_kwargs!r}")
            out.append(self._generate_one(context, until, max_new))
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), out[-1])
        return out

    def _generate_one(self, context: str, until: list[str], max_new: int) -> str:
        prompt = self.tok_encode(context)[-max(1, self.max_length - max_new):]
        eot = -1 if self._eot is None else int(self._eot)  # no EOT: stop on strings/budget only

        def stop(new_ids: list[int]) -> bool:
            return (bool(new_ids) and new_ids[-1] == eot) or any(u in self.tok_decode(new_ids) for u in until)

        new_ids = greedy_decode(self.model, [prompt], max_new, max_length=self.max_length,
                                precision=self.precision, stop=stop)[0]
        if new_ids and new_ids[-1] == eot:
            new_ids = new_ids[:-1]
        text = self.tok_decode(new_ids)
        for u in until:
            text = text.split(u)[0]
        return text


def evaluate_tasks(lm: PhaseLabLM, tasks: Sequence[str], *, include_paths: Sequence[Path],
                   num_fewshot: int = 0, limit: float | None = None, log_samples: bool = True,
                   bootstrap_iters: int = 1000, include_defaults: bool = True) -> dict:
    """``lm_eval.simple_evaluate`` on ``tasks`` with our adapter instance and a local TaskManager
    (DESIGN §5.8). Returns lm_eval's results dict. ``limit`` caps examples per task (tests only);
    ``bootstrap_iters`` feeds bootstrapped stderrs (means have a closed form; 0 disables all).
    ``include_defaults=False`` skips indexing lm-eval's built-in tasks (seconds of YAML parsing)
    when only phaselab's bundled tasks are requested."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    if not tasks:
        raise ValueError("lm-eval needs at least one task name")
    tm = TaskManager(include_path=[str(p) for p in include_paths], include_defaults=include_defaults)
    results = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=num_fewshot, task_manager=tm,
                                      limit=limit, log_samples=log_samples,
                                      bootstrap_iters=bootstrap_iters)
    if results is None:  # only non-zero ranks get None; we always run single-process
        raise RuntimeError("lm_eval.simple_evaluate returned no results")
    return results


def results_to_records(results: dict, *, context_len: int) -> list:
    """One MetricRecord per (task or group, metric) in ``results["results"]``: name = metric with
    its filter ("acc", "acc_norm", "acc@flex"), unit "fraction" for accuracies, n = examples
    scored, stderr when lm_eval computed one (nan/"N/A" -> None)."""
    from phaselab.catalog.tracking import MetricRecord

    out = []
    for task, metrics in sorted(results["results"].items()):
        n = metrics.get("sample_len")
        for key, value in sorted(metrics.items()):
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            err = metrics.get(f"{metric}_stderr,{filt}")
            err = float(err) if isinstance(err, (int, float)) and math.isfinite(float(err)) else None
            out.append(MetricRecord(name=metric if filt == "none" else f"{metric}@{filt}", value=float(value),
                                    unit="fraction" if metric.startswith(("acc", "exact_match")) else "",
                                    context_len=context_len, task=task, n=None if n is None else int(n),
                                    stderr=err))
    return out


def write_outputs(results: dict, out_dir: Path) -> dict[str, Path]:
    """Artifacts: ``lm_eval_results.json`` (results, groups, versions, configs, n-samples, n-shot:
    the eval_meta of DESIGN §5.8) and ``lm_eval_samples/<task>.jsonl`` when samples were logged."""
    out_dir = Path(out_dir)
    meta = {k: results.get(k) for k in ("results", "groups", "group_subtasks", "versions", "configs",
                                         "n-samples", "n-shot", "lm_eval_version")}
    arts = {"lm_eval_results.json": out_dir / "lm_eval_results.json"}
    arts["lm_eval_results.json"].write_text(json.dumps(meta, indent=1, default=str))
    samples = results.get("samples") or {}
    if samples:
        (out_dir / "lm_eval_samples").mkdir(exist_ok=True)
    for task, rows in sorted(samples.items()):
        path = out_dir / "lm_eval_samples" / f"{task}.jsonl"
        path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
        arts[f"lm_eval_samples/{task}.jsonl"] = path
    return arts
