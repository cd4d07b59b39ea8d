"""Next-item prediction (SASRec-style) on interaction files or synthetic sequences (``model=sequential``)."""
from .task import SequentialTask

__all__ = ["SequentialTask"]
