"""Next-item prediction (SASRec-style) on interaction files or synthetic sequences (``model=sequential``).

``task.py`` holds :class:`~runner.tasks.sequential.task.SequentialTask` (``runner.tasks.import_tasks``
registers it); ``report.py`` what a report shows of its runs. Nothing is imported here, so a report reads
``report.py`` without importing JAX or pyarrow.
"""
