"""The grid language: YAML read within bounds (``yamlio``, ``limits``), the schema and its
FILE:LINE:COLUMN errors (``spec``), command-line overrides (``overrides``), expansion of axes and
seeds into cells (``expand``), the shipped grids by name (``library``) and the generated grid
reference (``reference``)."""
