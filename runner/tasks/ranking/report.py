"""What ``python -m runner.report`` shows of a ranking run: one panel per AUC key, the Bayes-optimal AUC of the
same labels (``bayes/<metric>``, from the generator's true probabilities) as a dotted line on its panel."""
from __future__ import annotations

from .. import ReportMetrics

REPORT = ReportMetrics(objective="valid/auc_mean", charted=r"(^|[_\-.])auc($|[_\-.])", chart="AUC",
                       chart_file="auc.png", reference="bayes/", reference_name="Bayes-optimal")
