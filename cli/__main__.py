"""``python -m rankwatch.cli`` runs the console script."""

from rankwatch.cli.main import main

main()
