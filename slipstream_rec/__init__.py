"""slipstream_rec: sharded TorchRec DLRM training that skips inputs whose embeddings are stale."""

__version__ = "0.1.0"
