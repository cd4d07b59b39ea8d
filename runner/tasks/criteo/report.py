"""What ``python -m runner.report`` shows of a Criteo run: the AUC panels, with the Bayes-optimal AUC of the
same labels (``bayes/<split>/auc``, generated logs only) as a dotted line."""
from __future__ import annotations

from .. import ReportMetrics

REPORT = ReportMetrics(objective="valid/auc", charted=r"(^|[_\-.])auc($|[_\-.])", chart="AUC", chart_file="auc.png",
                       reference="bayes/", reference_name="Bayes-optimal")
