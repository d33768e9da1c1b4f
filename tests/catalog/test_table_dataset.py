"""Tables name the dataset their stages read: the quickstart table over one's own text is not
captioned "Tiny Shakespeare"."""

from __future__ import annotations

from datetime import UTC, datetime

from catalog_testlib import add_stage, cell, h, run_stage

from phaselab.catalog.reports.tables import get_spec, render_table
from phaselab.catalog.reports.tables.dataset import dataset_label
from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking import MetricRecord

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _quickstart(store: CatalogStore, data: dict) -> str:
    gid = store.upsert_grid(name="quickstart", grid_hash=h("q"), yaml_submitted="", yaml_resolved="")
    cid = cell(store, gid, {"pe": "rope", "seed": 0})
    stage = add_stage(store, cid, "ppl", role="ppl", config={"eval": {"suite": "ppl-by-length", "data": data}})
    run_stage(store, stage, [MetricRecord(name="ppl", value=4.5, context_len=16)])
    rendered = render_table(store, get_spec("quickstart_ppl"), "md", now=NOW, record=False)
    return rendered.text.splitlines()[0]


def test_quickstart_table_names_the_grids_data(sqlite_store: CatalogStore) -> None:
    title = _quickstart(sqlite_store, {"kind": "text", "block_size": 16, "text": {"path": "/home/me/my_corpus"}})
    assert title == "### Quickstart: my_corpus perplexity by evaluation length (trained at 16)"


def test_quickstart_table_over_the_shipped_data_keeps_its_title(sqlite_store: CatalogStore) -> None:
    title = _quickstart(sqlite_store, {"kind": "text", "text": {"path": "tinyshakespeare.txt"}})
    assert title == "### Quickstart: Tiny Shakespeare perplexity by evaluation length (trained at 16)"


def test_dataset_labels() -> None:
    assert dataset_label({"kind": "text", "text": {"path": "/data/books/**/*.md"}}) == "books"
    assert dataset_label({"kind": "text", "text": {"path": "/data/war_and_peace.txt"}}) == "war_and_peace"
    assert dataset_label({"kind": "tokens", "real": {"shards_dir": "/data/tinystories/"}}) == "tinystories"
    assert dataset_label({"kind": "jsb"}) == "jsb"
