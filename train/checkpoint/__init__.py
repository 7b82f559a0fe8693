"""Checkpoints: the store (atomic writes, newest-valid discovery, retention), the writer process and
the trainer's side of it, the wire format between them, resume's broadcast, and the Checkpointer, which
owns the save policy. Nothing is imported here: the writer process loads only what it needs.
"""
