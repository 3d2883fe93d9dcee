"""The package version, recorded in every run's provenance."""
__version__ = "0.1.0"
