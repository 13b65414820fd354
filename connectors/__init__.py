"""isotrope.connectors: everything that imports a third-party system (FAISS, LanceDB, LlamaIndex, Ray, the server)."""
