"""Multi-action ranking on the synthetic generator (``data=synthetic``, ``model=ranking``)."""
from .task import RankingTask

__all__ = ["RankingTask"]
