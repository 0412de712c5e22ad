"""`python -m maxckpt` runs the CLI."""

from maxckpt.cli.main import main

if __name__ == "__main__":
    main()
