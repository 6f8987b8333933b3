"""CUDA sources of the bundled kernel, installed as package data."""
