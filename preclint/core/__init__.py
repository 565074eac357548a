"""The core every stage shares: the IR, findings, formats and modes, errors and exit codes, progress. No I/O."""
