"""The bundled CUDA kernel: build on first use, typed op wrappers, and the plain-torch reference of every op."""
