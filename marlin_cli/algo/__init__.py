"""Quantization algorithms: tensors in, tensors out."""
