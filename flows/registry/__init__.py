"""Registry commands: ``python -m flows.registry verify`` checks the tamper-evident trail."""
