"""The benchmark suite: ``python -m benchmarks [--quick] [--only NAME]`` writes benchmarks/results/.

One module per benchmark, each runnable on its own as ``python -m benchmarks.<name> [--quick] [--out DIR]``
and exposing ``run(quick, out) -> dict`` (its JSON data, with a ``targets`` list where the issue sets one).
Timings are medians over interleaved rounds after warm-up; ratios are taken in the same run, pair by pair.
"""
