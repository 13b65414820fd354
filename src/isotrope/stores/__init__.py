"""Vector stores: the protocol, the exact in-memory reference, and metadata filters."""

from isotrope.stores.base import Hit, StoreFormatError, VectorStore
from isotrope.stores.memory import MemoryStore

__all__ = ["Hit", "MemoryStore", "StoreFormatError", "VectorStore"]
