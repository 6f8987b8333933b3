"""Open a model; find its repeated blocks and the linear layers inside them."""
