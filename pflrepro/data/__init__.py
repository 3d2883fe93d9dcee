"""Registries of what a federation is made of: datasets (with their loaders), partition and split
rules (with their settings' schemas), models (with their builders). Imports params only."""
