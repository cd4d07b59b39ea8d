"""The generator's default cardinalities: Criteo Terabyte's published ones over one factor, with a floor."""
from pathlib import Path

import yaml

from runner.tasks.criteo.synthetic import (DEFAULT_CARDINALITIES, FLOOR, SCALE, TERABYTE_CARDINALITIES, CriteoSpec,
                                           scaled)

ROOT = Path(__file__).resolve().parents[4]
# pytorch/torchrec examples/dlrm/README.MD, --num_embeddings_per_feature of the "Full Size" row (uncapped) and of
# the "MLPerf" row (MLPerf DLRM v1's 40M cap), copied as published
FULL_SIZE = "227605432,39060,17295,7424,20265,3,7122,1543,63,130229467,3067956,405282,10,2209,11938,155,4,976,14," \
            "292775614,40790948,187188510,590152,12973,108,36"
MLPERF = "40000000,39060,17295,7424,20265,3,7122,1543,63,40000000,3067956,405282,10,2209,11938,155,4,976,14," \
         "40000000,40000000,40000000,590152,12973,108,36"
TERABYTE_LINES = 4_195_197_692 + 89_137_318 + 89_137_319  # MLPerf's train (days 0-22), valid and test (day 23)


def test_the_real_cardinalities_are_the_published_ones():
    assert TERABYTE_CARDINALITIES == tuple(int(c) for c in FULL_SIZE.split(","))
    assert [min(c, 40_000_000) for c in TERABYTE_CARDINALITIES] == [int(c) for c in MLPERF.split(",")]


def test_the_defaults_are_the_real_ones_over_one_factor_with_a_floor():
    assert (SCALE, FLOOR) == (1000, 100)
    expected = []
    for real in TERABYTE_CARDINALITIES:
        if real <= FLOOR:
            expected.append(real)  # a small feature keeps its real count
        else:
            expected.append(max(real // SCALE, FLOOR))
    assert DEFAULT_CARDINALITIES == tuple(expected) == scaled()
    assert DEFAULT_CARDINALITIES[:3] == (227_605, 100, 100) and DEFAULT_CARDINALITIES[5] == 3
    assert DEFAULT_CARDINALITIES[10] == 3_067 and DEFAULT_CARDINALITIES[19] == 292_775
    assert sum(DEFAULT_CARDINALITIES) == 883_979
    assert scaled(scale=1, floor=1) == TERABYTE_CARDINALITIES
    assert CriteoSpec().cardinalities == DEFAULT_CARDINALITIES and CriteoSpec().problems() == []


def test_the_experiment_generates_terabytes_lines_over_the_same_factor():
    cfg = yaml.safe_load((ROOT / "conf" / "experiment" / "criteo_synthetic.yaml").read_text())
    assert cfg["data"]["lines"] == TERABYTE_LINES // SCALE == 4_373_472
