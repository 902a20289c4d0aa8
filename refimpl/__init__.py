"""refimpl: readable NumPy reference implementations of transformer math.

One concept per module, read in the order the data flows:
masks -> positional -> attention -> ffn / norms -> gpt2.
"""

__version__ = "0.1.0"
