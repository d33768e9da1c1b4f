"""The SQL catalog: engine and migrations (``db``, ``migrations/``), tables (``schema``), the one
read/write API (``api.CatalogStore``, its queries in ``queries``, value types in ``rows``),
lineage walks (``lineage``), the environment fingerprint (``fingerprint``) and where the
project's ``.phaselab/`` lives (``home``)."""
