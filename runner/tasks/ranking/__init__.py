"""Multi-action ranking on the synthetic generator (``data=synthetic``, ``model=ranking``).

``task.py`` holds :class:`~runner.tasks.ranking.task.RankingTask` (``runner.tasks.import_tasks`` registers it);
``report.py`` what a report shows of its runs. Nothing is imported here, so a report reads ``report.py``
without importing JAX.
"""
