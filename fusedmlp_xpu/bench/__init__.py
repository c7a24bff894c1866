"""The measuring tools, apart from the op they measure (nothing in the op, the dispatcher
or the backends imports them).

    configs.py    the standard configs (benchmarks/README.md) for bench and profile
    narrow.py     ``fusedmlp bench`` (narrow suite): the harness and its CLI options
    wide.py       ``fusedmlp bench --suite wide``: transformer FFN blocks
    steps.py      ``fusedmlp bench --suite steps``: whole training steps
    tools.py      what the harnesses share: the environment, device-event timing
    results.py    the results tables (one JSON Lines file per machine, appended to)
    profiling.py  ``fusedmlp profile``: eager vs torch.compile vs FusedMLP under torch.profiler
    report.py     ``fusedmlp report``: results tables -> one page across vendors, plots, appendix
    report_data.py     the runs read and checked, passes merged; Markdown helpers
    report_plots.py    the report's figures
    report_intel.py    the Max 1550's rows: the static model, the listing, Table I
    report_history.py  ``--history``: every run, the report as it was before the page
    pvc.py        the Max 1550 without the card: floors, ISA listing, the static model
    targets.py    the benchmark targets as data, checked by the report
"""
