"""phaselab: reproducible experiments comparing transformer positional encodings."""

__version__ = "0.1.0"
