"""`python -m training`: the container command (see training/cli.py)."""

from training.cli import main

if __name__ == "__main__":
    main()
