"""isotrope: shaped sentence encoders and the vector stores that keep them."""

__version__ = "0.1.0"
