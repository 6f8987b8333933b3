"""Calibration: text sources -> token samples, and the capture of layer inputs."""
