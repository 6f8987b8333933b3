"""Quantization presets (YAML), installed as package data."""
