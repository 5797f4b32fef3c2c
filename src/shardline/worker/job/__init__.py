"""One instance's job: the command line (``cli``), the job it runs (``run``), its summary and manifest
(``report``), the ledger's side off the hot path (``ledger_hooks``, ``ledger_pump``) and the exit codes."""
