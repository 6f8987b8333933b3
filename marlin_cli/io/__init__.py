"""Checkpoint I/O at the edges: validated reading, atomic writing."""
