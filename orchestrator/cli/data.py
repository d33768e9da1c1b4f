"""``phaselab data prepare``: a Hugging Face dataset (hub name or ``save_to_disk`` folder)
tokenised once into a shard folder that grids read as ``data: {kind: tokens, real:
{shards_dir: OUT}}`` (workloads.data.hf; needs the ``data`` extra)."""

from __future__ import annotations

from pathlib import Path

import typer

from phaselab.orchestrator.cli.common import JSON, emit, fail, make_console

OUT = typer.Option(..., "--out", help="Shard folder to write (train.bin, valid.bin, meta.json).")


def register(app: typer.Typer) -> None:
    data_app = typer.Typer(no_args_is_help=True, help="Prepare your own data for grids.")
    app.add_typer(data_app, name="data")

    @data_app.command("prepare")
    def prepare(source: str = typer.Argument(..., help="Hub name, or a folder written by save_to_disk."),
                out: Path = OUT,
                text_field: str = typer.Option("text", "--text-field", help="Column holding each document."),
                tokenizer: str = typer.Option("gpt2", "--tokenizer", help="gpt2 or tiktoken:<encoding>."),
                hf_config: str = typer.Option(None, "--config", help="Hub dataset configuration."),
                valid_fraction: float = typer.Option(0.0005, "--valid-fraction",
                                                     help="Last rows held out when there is no validation split."),
                force: bool = typer.Option(False, "--force", help="Prepare again even if OUT holds this preparation."),
                as_json: bool = JSON) -> None:
        """Tokenise a Hugging Face text dataset once into shards, showing progress per split."""
        from rich.progress import Progress

        from phaselab.workloads.data import MissingExtraError
        from phaselab.workloads.data.hf import prepare_hf

        with Progress(console=make_console(), disable=as_json, transient=False) as bar:
            tasks: dict[str, int] = {}

            def progress(split: str, done: int, total: int) -> None:
                if split not in tasks:
                    tasks[split] = bar.add_task(f"tokenising {split}", total=total)
                bar.update(tasks[split], completed=done)

            try:
                meta = prepare_hf(source, out, text_field=text_field, tokenizer=tokenizer, hf_config=hf_config,
                                  valid_fraction=valid_fraction, progress=progress, force=force)
            except (MissingExtraError, ValueError, TypeError, OSError) as err:
                fail(as_json, str(err))
        emit(as_json, {"ok": True, "out": str(out), "splits": meta["splits"], "vocab_size": meta["vocab_size"]})
        if not as_json:
            splits = ", ".join(f"{s} {v['tokens']} tokens ({v['documents']} documents)" for s, v in meta["splits"].items())
            make_console().print(f"{out}: {splits}; vocabulary {meta['vocab_size']}. In a grid: "
                                 f"data: {{kind: tokens, real: {{shards_dir: {out.resolve()}}}}}")
