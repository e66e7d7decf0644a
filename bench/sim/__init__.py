"""The fleet simulator's parts: the workload (`workload`), the discrete-event run that
drives the real ledger, daemon, meter and bridge code (`engine`), and the books check
and report (`books`). `python -m bench.simulate` is the entry point."""
