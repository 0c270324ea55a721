"""fcp's companion executor: replays plan files with PyTorch (see docs/executor.md)."""
