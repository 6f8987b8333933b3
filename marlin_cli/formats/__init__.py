"""Checkpoint tensor layouts: pure pack_*/unpack_* functions."""
