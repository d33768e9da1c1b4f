"""phaselab.kernels.attention: score modifiers, the reference (MATH.md's executable form) and backends.

See README.md in this folder for the score table and the backend support matrix. Submodules are
imported explicitly (nothing here), so importing `score_mod` does not pull in the Triton kernels.
"""
