"""marlin: quantize Hugging Face models to 4-bit Marlin-format safetensors with GPTQ, and verify them."""

__version__ = "0.1.0"
