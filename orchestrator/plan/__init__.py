"""From a validated grid to a plan: the stage DAG with one node per content hash (``dag``), the
cache keys and their explanations (``hashing``), and the static import graph behind each stage's
code digest (``closure``)."""
