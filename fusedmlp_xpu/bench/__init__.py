"""The measuring tools, apart from the op they measure (nothing in the op, the dispatcher
or the backends imports them).

    configs.py    the standard configs (benchmarks/README.md) for bench and profile
    narrow.py     ``fusedmlp bench`` (narrow suite): the harness and its CLI options
    wide.py       ``fusedmlp bench --suite wide``: transformer FFN blocks
    steps.py      ``fusedmlp bench --suite steps``: whole training steps
    tools.py      what the harnesses share: the environment, device-event timing
    results.py    the results tables (one JSON Lines file per machine, appended to)
    profiling.py  ``fusedmlp profile``: eager vs torch.compile vs FusedMLP under torch.profiler
    report.py     ``fusedmlp report``: results tables -> Markdown with plots
    targets.py    the benchmark targets as data, checked by the report
"""
