"""Vector stores: the protocol, the exact in-memory reference, and metadata filters."""

from isotrope.errors import StoreFormatError
from isotrope.stores.base import Hit, ReshapableStore, VectorStore
from isotrope.stores.memory import MemoryStore

__all__ = ["Hit", "MemoryStore", "ReshapableStore", "StoreFormatError", "VectorStore"]
