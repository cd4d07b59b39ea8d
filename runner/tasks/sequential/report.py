"""What ``python -m runner.report`` shows of a next-item run: one panel per HR@k, NDCG@k and MRR key, the
oracle's value (``oracle/<metric>``: the synthetic world's true next-item probabilities ranked the same way) as
a dotted line on its panel; the popularity baseline (``popularity/...``) and the selected state's metrics
(``best/...``, one value at the end) get no panel."""
from __future__ import annotations

from .. import ReportMetrics

REPORT = ReportMetrics(objective="valid/ndcg@10", charted=r"^((hr|ndcg)@\d+|mrr)$", chart="HR/NDCG/MRR",
                       chart_file="ranking_metrics.png", reference="oracle/", reference_name="Bayes-optimal oracle",
                       not_charted=("popularity/", "best/"))
