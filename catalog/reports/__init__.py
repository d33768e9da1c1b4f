"""What the catalog renders: paper tables (``tables/``), figures (``figures``, ``grid_figures``,
``curves``, ``run_figures``, one look in ``plotstyle``) and the Parquet/CSV export (``export``)."""
