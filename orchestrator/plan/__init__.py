"""From a validated grid to a plan: the stage DAG with one node per content hash (``dag``), the
cache keys and their explanations (``hashing``), the static import graph behind each stage's
code digest (``closure``), and what each stage asks of the cluster against what it has
(``placement``: GPU packing, placement checks and warnings)."""
